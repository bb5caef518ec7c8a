"""The ``general.*`` metadata of a converted drafter, derived the way llama.cpp's converter derives it.

llama.cpp's ``convert_hf_to_gguf.py`` (``ModelBase.prepare_metadata``) counts the parameters of the
tensors it wrote (``GGUFWriter.get_total_parameter_count``), runs gguf-py's ``gguf.Metadata.load``
heuristics on the checkpoint directory (its name, README.md model card, config.json,
generation_config.json), falls back to the directory name for ``general.name``, derives
``general.size_label`` with ``gguf.size_label``, then writes ``general.type`` and
``Metadata.set_gguf_meta_model``'s keys in that order. This module calls those same gguf-py
functions on a scratch ``GGUFWriter`` and hands the resulting entries back in order — nothing is
re-implemented, so a local directory gets exactly llama.cpp's keys.

Provenance: a hub download (a huggingface_hub cache snapshot path), or ``--source-repo`` /
``--source-revision``, fills gguf-py's ``general.source.repo_url`` / ``general.source.url`` (and, for a
hub download, ``general.name`` = the repo id, as llama.cpp does for ``--remote``). A local directory
without provenance gets nothing more than llama.cpp writes.

One hand-written line: gguf 0.19 on PyPI reads ``generation_config.json``'s ``repetition_penalty``
no longer as ``general.sampling.penalty_repeat``; llama.cpp's own gguf-py (llama-cpp-python 0.3.36)
does, so `_llama_cpp_sampling_fallback` restores that one fallback.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from gguf import GGUFType, GGUFValueType, GGUFWriter, Metadata, size_label

from ..errors import DFlashError
from ..bounds import _kind, escape_name
from ..files import read_json, side_file
from ..io.gguf_writer import MetadataEntry

HUB_URL = "https://huggingface.co"
#: huggingface_hub cache layout: .../models--OWNER--NAME/snapshots/COMMIT[/...]
_HUB_SNAPSHOT = re.compile(r"(?:^|/)models--(?P<repo>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})(?:/|$)")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Provenance:
    """Where a checkpoint came from, when known: hub repo id and revision (a commit or a ref)."""

    repo_id: str | None = None
    revision: str | None = None
    #: True when the checkpoint directory is a hub download (the repo id then names the model)
    from_hub: bool = False

    @property
    def repo_url(self) -> str | None:
        return f"{HUB_URL}/{self.repo_id}" if self.repo_id else None

    @property
    def url(self) -> str | None:
        if self.repo_id and self.revision:
            return f"{HUB_URL}/{self.repo_id}/tree/{self.revision}"
        return None


def provenance_from_path(directory: str | Path) -> Provenance:
    """Repo id and commit of a huggingface_hub cache snapshot directory (empty for any other path)."""
    m = _HUB_SNAPSHOT.search(Path(directory).absolute().as_posix())
    if m is None:
        return Provenance()
    # the cache folder is "models--" + repo_id with "/" written as "--"
    return Provenance(repo_id=m.group("repo").replace("--", "/", 1), revision=m.group("commit"), from_hub=True)


#: a hub revision as it may appear in a URL path: a commit hash, a tag or a branch (git's own ref rules, narrowed to
#: what needs no escaping: no spaces, control characters, '..', '~', '^', ':', '?', '*', '[' or backslashes)
_REVISION = re.compile(r"(?!.*\.\.)(?!/)(?!.*/$)[A-Za-z0-9._/-]{1,255}")


def resolve_provenance(
    directory: str | Path, *, source_repo: str | None = None, source_revision: str | None = None
) -> Provenance:
    """Provenance of ``directory``: the hub cache path's, with explicit flags filling or checking it."""
    found = provenance_from_path(directory)
    if source_repo is not None and not _REPO_ID.match(source_repo):
        raise DFlashError(f"--source-repo {source_repo!r} is not a hub repo id (owner/name)")
    if source_repo is not None and found.repo_id is not None and source_repo != found.repo_id:
        raise DFlashError(f"{directory}: --source-repo {source_repo} contradicts the hub cache path's repo {found.repo_id}")
    if source_revision is not None and not _REVISION.fullmatch(source_revision):
        raise DFlashError(f"--source-revision '{escape_name(source_revision)}' is not a git revision (a commit hash, "
                          "tag or branch: letters, digits and . _ - / only, no '..'); it goes into "
                          "general.source.url as is")
    if source_revision is not None and found.revision is not None and source_revision != found.revision:
        raise DFlashError(
            f"{directory}: --source-revision {source_revision} contradicts the hub cache path's commit {found.revision}"
        )
    repo = source_repo or found.repo_id
    if source_revision is not None and repo is None:
        raise DFlashError(f"{directory}: --source-revision needs --source-repo (which repository is it a revision of?)")
    return Provenance(repo_id=repo, revision=source_revision or found.revision, from_hub=found.from_hub)


def parameter_counts(tensors: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, int, int, int]:
    """(total, shared, expert, expert count) of the output tensors (GGUF name, numpy shape), counted by
    gguf-py's ``GGUFWriter.get_total_parameter_count`` as llama.cpp's converter counts them."""
    writer = GGUFWriter(path=None, arch="dflash")
    for name, shape in tensors:
        writer.add_tensor_info(name, tuple(int(d) for d in shape), np.dtype(np.float32), 0)
    return writer.get_total_parameter_count()


def _llama_cpp_sampling_fallback(metadata: Metadata, directory: Path) -> None:
    path = directory / "generation_config.json"
    if metadata.sampling_penalty_repeat is not None or not side_file(path):
        return
    try:
        config = read_json(path)  # bounded, strict (files.read_json)
    except DFlashError:
        return  # gguf-py already read (or refused) it; nothing to add
    if isinstance(config, dict) and "penalty_repeat" not in config and "repetition_penalty" in config:
        metadata.sampling_penalty_repeat = config["repetition_penalty"]


def general_metadata(
    directory: str | Path,
    tensors: Sequence[tuple[str, tuple[int, ...]]],
    *,
    provenance: Provenance | None = None,
) -> list[MetadataEntry]:
    """``general.type`` and the model-card keys (name, size_label, source, base models ...) in llama.cpp's
    order for the checkpoint ``directory`` converted into ``tensors`` (GGUF name, numpy shape)."""
    directory = Path(directory)
    provenance = provenance or Provenance()
    total, shared, expert, expert_count = parameter_counts(tensors)
    for name in ("README.md", "generation_config.json"):  # gguf-py skips what is not a regular file, silently
        side_file(directory / name)
    try:
        metadata = Metadata.load(None, directory, None, total)
    except (OSError, ValueError) as exc:  # a malformed README.md front matter or JSON file
        raise DFlashError(f"{directory}: cannot read the model card metadata ({exc})") from None
    _llama_cpp_sampling_fallback(metadata, directory)
    if provenance.from_hub and provenance.repo_id:
        metadata.name = provenance.repo_id  # as llama.cpp names a --remote conversion
    if metadata.name is None:
        metadata.name = directory.name or directory.resolve().name
    if metadata.size_label is None and total > 0:
        metadata.size_label = size_label(total, shared, expert, expert_count)
    if provenance.repo_url:
        metadata.source_repo_url = provenance.repo_url
    if provenance.url:
        metadata.source_url = provenance.url

    writer = GGUFWriter(path=None, arch="dflash")
    writer.add_type(GGUFType.MODEL)
    try:
        metadata.set_gguf_meta_model(writer)
    except (ValueError, TypeError) as exc:  # a list of mappings where gguf-py wants strings, …
        raise DFlashError(f"{directory / 'README.md'}: the model card's front matter holds a value a GGUF key cannot "
                          f"take ({escape_name(str(exc), limit=120)}) — fix it") from None
    for key, v in writer.kv_data[0].items():  # a card's front matter can hold any YAML: gguf-py writes it unchecked
        items = v.value if v.type == GGUFValueType.ARRAY and isinstance(v.value, list) else [v.value]
        want = v.sub_type if v.type == GGUFValueType.ARRAY else v.type
        if want == GGUFValueType.STRING and not all(isinstance(x, str) for x in items):
            bad = next(x for x in items if not isinstance(x, str))
            raise DFlashError(f"{directory / 'README.md'}: the model card gives {key} as {_kind(bad)}, not text — "
                              "fix its front matter (llama.cpp's converter stops there too)")
        try:  # what the writer would do with it at the end, done now: a mixed list, an out-of-range number
            writer._pack_val(v.value, v.type, add_vtype=True, sub_type=v.sub_type)
        except (ValueError, TypeError, OverflowError, struct.error) as exc:
            raise DFlashError(f"{directory / 'README.md'}: the model card's {key} cannot be written to a GGUF "
                              f"({escape_name(str(exc), limit=120)}) — fix its front matter") from None
    return [
        MetadataEntry(key, v.value, v.type, v.sub_type)
        for key, v in writer.kv_data[0].items()
        if key != "general.architecture"
    ]
