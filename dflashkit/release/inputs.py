"""What a release knows of its inputs: the names it publishes and the digest it resumes by.

- **Names, never paths.** A published file names the source and the target by hub id (given, or read from a folder
  of the Hugging Face cache) or by the folder's base name (`public_name`), the release files by a sanitised name
  (`release_name`); every such name is checked at the start (`check_names`: UTF-8, at most ``MAX_NAME``
  characters) so that the record the release writes is one its own ``--check`` reads.
- **The same release; the same content.** `inputs_digest` gives two digests: which release this is (the inputs'
  resolved paths, the settings, the llama.cpp build and target GGUF used) — a folder holding another is not
  written into — and what its figures were made from (a fingerprint of every file under the inputs: relative
  path, size, modification time, so a replaced weight file changes it; the prompts' bytes; dflashkit's version),
  which each job's seal binds together with the sha256 of the shared F32 conversion (`run`): a kept job is one made
  from these very weights. Only the first digest is recorded; the paths stay on this machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from ..errors import UsageError
from ..files import input_files
from .inside import NotInside
from .schema import MAX_NAME

CARD = "README.md"
MAX_SOURCE_CARD_BYTES = 1 << 20
MAX_PROMPTS_BYTES = 64 << 20
_FINGERPRINT_FILES = 100_000


def hub_id_of(path: str | os.PathLike) -> str | None:
    """``org/name`` of a folder in the Hugging Face cache (``…/models--org--name/snapshots/<rev>``), else None."""
    for part in Path(path).parts:
        if part.startswith("models--") and part.count("--") >= 2:
            return part[len("models--"):].replace("--", "/", 1)
    return None


def public_name(given: str | os.PathLike, repo: str | None) -> str:
    """How a published file names an input: its hub id (given, or from the HF cache), a hub id given as SRC, or the
    folder's base name — never a path of this machine."""
    if repo:
        return repo
    text = str(given)
    if not Path(text).exists() and not text.startswith(("/", ".", "~")) and text.count("/") == 1:
        return text  # a hub id given as the input
    return hub_id_of(text) or Path(os.path.abspath(text)).name or "model"


def release_name(src: str | os.PathLike, source_repo: str | None) -> str:
    base = public_name(src, source_repo).rstrip("/").split("/")[-1] or "drafter"
    return re.sub(r"[^A-Za-z0-9._-]", "-", base)[:120] or "drafter"


#: how the type files are named: ``source`` — ``<release name>-<TYPE>.gguf`` (the drafter's name); ``target`` —
#: ``dflash-<target>-<TYPE>.gguf``, ggml-org/convert's name for a drafter beside its target's files, the sibling
#: name Unsloth Studio finds a drafter by
NAMINGS = ("source", "target")
_TARGET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def file_prefix(naming: str, name: str, target: str | os.PathLike, target_repo: str | None,
                target_name: str | None) -> tuple[str, str | None]:
    """(the type files' prefix, the target's name in it): ``name`` for the source naming; ``dflash-<target>`` for
    the target naming, ``<target>`` being ``target_name`` or the target's hub id / folder name (its last part)."""
    if naming not in NAMINGS:
        raise UsageError(f"--naming {naming}: choose {' or '.join(NAMINGS)}")
    if naming == "source":
        if target_name is not None:
            raise UsageError("--target-name names the files after the target: use it with --naming target")
        return name, None
    given = target_name is not None
    short = target_name if given else public_name(target, target_repo).rstrip("/").split("/")[-1]
    if not given:
        short = re.sub(r"[^A-Za-z0-9._-]", "-", short).lstrip("-._")[:100]
    if not short or not _TARGET_NAME.match(short):
        raise UsageError(f"--target-name {short!r}: give the target's name as letters, digits, '.', '_' or '-' "
                         "(at most 100, starting with a letter or digit), e.g. --target-name Qwen3-8B")
    return f"dflash-{short}", short


def _license_of(src: Path) -> str | None:
    """The source card's ``license`` when it is one short string; a card that is no regular file, too big or
    malformed only leaves the license out."""
    from .inside import read_inside

    try:
        text = read_inside(src, CARD, MAX_SOURCE_CARD_BYTES).decode("utf-8")
        from huggingface_hub import ModelCard

        value = ModelCard(text).data.license
    except (NotInside, UnicodeDecodeError, Exception):  # noqa: BLE001 - a card we cannot read leaves it out
        return None
    return value if isinstance(value, str) and 0 < len(value) <= 100 and value.isprintable() else None


def fingerprint(given: str | os.PathLike | None) -> Any:
    """An input as the digest sees it: its resolved path and (relative path, size, mtime) of every file under it; a
    name that is no path (a hub id) as it is."""
    if given is None:
        return None
    p = Path(given)
    if not p.exists():
        return str(given)
    files = []
    for n, f in enumerate(sorted(input_files([p]) if p.is_dir() else [p])):
        if n >= _FINGERPRINT_FILES:
            break
        try:
            st = f.stat()
        except OSError:
            continue
        files.append((os.path.relpath(f, p) if p.is_dir() else f.name, st.st_size, st.st_mtime_ns))
    return {"path": str(p.resolve()), "files": files}


def _prompts_digest(prompts: str | os.PathLike | None) -> str | None:
    """sha256 of the prompts file's bytes (bounded: a bigger file is refused where it is read)."""
    if prompts is None:
        return None
    h = hashlib.sha256()
    try:
        with open(prompts, "rb") as f:
            h.update(f.read(MAX_PROMPTS_BYTES + 1))
    except OSError:
        return str(prompts)  # the prompts step names what is wrong with it
    return h.hexdigest()


def _where(p: str | os.PathLike | None) -> str | None:
    return None if p is None else (str(Path(p).resolve()) if Path(p).exists() else str(p))


def inputs_digest(src: str | os.PathLike, target: str | os.PathLike, prompts: str | os.PathLike | None,
                  settings: dict[str, Any], llama: dict[str, Any], version: str,
                  extra: dict[str, Any] | None = None) -> tuple[str, str]:
    """(which release this is, what its figures were made from), as two digests. The first — the inputs' resolved
    paths, the settings, the llama.cpp build and target GGUF — must match for a release to write into a folder
    holding one; the second — the fingerprint of every file under them, the prompts' bytes, dflashkit's version —
    is sealed with each job, so a job made from other weights is measured again rather than kept. ``extra``: more
    settings the figures depend on (llama.cpp's extra arguments, threads, the chat template's switches), in the
    first digest when given."""
    def each(fn: Any, v: Any) -> Any:  # a value, or a list of them (--llama-server builds)
        return [fn(x) for x in v] if isinstance(v, (list, tuple)) else fn(v)

    identity = {"source": _where(src), "target": _where(target), "prompts": _where(prompts), "settings": settings,
                "llama": {k: each(_where, v) for k, v in sorted(llama.items())}, **({"extra": extra} if extra else {})}
    content = {"source": fingerprint(src), "target": fingerprint(target), "prompts": _prompts_digest(prompts),
               "llama": {k: each(fingerprint, v) for k, v in sorted(llama.items())}, "version": version}
    return tuple(hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()  # type: ignore
                 for doc in (identity, content))


def check_names(names: dict[str, str | None]) -> None:
    """Every name the record will hold, by the option that gives it: text of at most MAX_NAME characters that
    UTF-8 can carry — else a usage error now, not an unreadable record after the work."""
    for option, name in names.items():
        if name is None:
            continue
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{option}: the name {name.encode('utf-8', 'backslashreplace').decode()[:80]!r} is not "
                             "valid UTF-8 — a model card cannot carry it; rename it") from None
        if len(name) > MAX_NAME or "\x00" in name:
            raise UsageError(f"{option}: a name of {len(name)} characters — the release records names of at most "
                             f"{MAX_NAME}; give a shorter one")


#: an absolute path (or one under ~) of at least one folder: what a log line of llama.cpp or a message of a step
#: may carry of this machine — kept as its last part
_PATH = re.compile(r"(?<![\w.~-])(?:~|\.{0,2})/(?:[^\s/|'\"`:;,()\[\]<>]+/)+([^\s/|'\"`:;,()\[\]<>]*)")


def scrub_paths(text: str | None, known: Iterable[str | os.PathLike | None] = ()) -> str | None:
    """``text`` with every path of this machine cut to its base name: the paths dflashkit passed (as given, made
    absolute, resolved; the longest first), then anything else shaped like an absolute path. For every message a
    release stores or publishes (llama-server's own log lines name the model files it was given)."""
    if text is None:
        return None
    forms: set[str] = set()
    for p in known:
        if p is None or not str(p):
            continue
        for form in (str(p), os.path.abspath(p), os.path.realpath(p)):
            if len(form) > 1:
                forms.add(form.rstrip("/") or form)
    for form in sorted(forms, key=len, reverse=True):  # first: a known path may hold spaces, ':' or brackets
        text = text.replace(form + "/", "").replace(form, Path(form).name or "…")  # a folder's files: base names
    return _PATH.sub(lambda m: m.group(1) or "…", text)


def scrub_job(job: dict[str, Any], known: Iterable[str | os.PathLike | None]) -> None:
    """Every message a job's record keeps (failed gates, llama.cpp's refusal, llama-server's), scrubbed in place."""
    known = list(known)
    for gate in job.get("gates_failed", []):
        gate["why"] = scrub_paths(gate["why"], known)
    tau = job.get("tau") or {}
    if tau.get("llama_cpp_refused"):
        tau["llama_cpp_refused"] = scrub_paths(tau["llama_cpp_refused"], known)
    for entry in job.get("serving", []):
        entry["refused"] = scrub_paths(entry.get("refused"), known)
