"""Structural checks: what kind of file this is, whether it parses, and whether its layout is sound.

Opening goes through the hardened readers with ``strict=False`` so that every structural problem
becomes a finding (the readers never trust a count from the file and never read tensor data).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable

from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.findings import Finding, error, info, warning

__all__ = ["detect_kind", "open_context", "quant_mix"]
from dflashkit.io.gguf_reader import GGUFFormatError, open_gguf
from dflashkit.io.safetensors_reader import CheckpointFormatError, open_checkpoint

MAX_CONFIG_SIZE = 10_000_000
SNIFF_BYTES = 16


# --- kind detection -----------------------------------------------------------------------------


def _sniff(head: bytes) -> str | None:
    if head.startswith(b"GGUF"):
        return "gguf"
    # safetensors: u64 header length, then the JSON header's '{'
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:
        return "safetensors"
    return None


def _unknown_format(path: Path, head: bytes) -> Finding:
    hint = ""
    if head.startswith(b"PK\x03\x04"):
        hint = " (a zip/PyTorch checkpoint? convert it to safetensors first)"
    elif head.startswith(b"\x80"):
        hint = " (a pickled PyTorch checkpoint? convert it to safetensors first)"
    return error(
        "inspect.unknown_format",
        f"{path}: not a GGUF (magic b'GGUF') or safetensors file: starts with {head[:8]!r}{hint}",
        file=str(path), head=head[:8].hex(),
    )


def detect_kind(path: Path) -> tuple[str, Finding | None]:
    """("gguf" | "safetensors" | "unknown" | "missing", a finding when it cannot be inspected)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing", error("inspect.not_found", f"{path}: no such file or directory", file=str(path))
    except OSError as exc:
        return "unknown", error("inspect.unreadable", f"{path}: cannot access: {exc.strerror or exc}", file=str(path))
    if stat.S_ISDIR(st.st_mode):
        return "safetensors", None  # a checkpoint directory
    if not stat.S_ISREG(st.st_mode):
        return "unknown", error("inspect.not_a_file", f"{path}: not a regular file (device, FIFO or socket)", file=str(path))
    name = path.name.lower()
    if name.endswith(".gguf"):
        return "gguf", None  # even when empty or broken: the GGUF reader says what is wrong
    if name.endswith((".safetensors", ".index.json")):
        return "safetensors", None
    if st.st_size == 0:
        return "unknown", error("inspect.empty", f"{path}: file is empty (0 bytes)", file=str(path))
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        return "unknown", error("inspect.unreadable", f"{path}: cannot read: {exc.strerror or exc}", file=str(path))
    kind = _sniff(head)
    return (kind, None) if kind else ("unknown", _unknown_format(path, head))


# --- opening + summary ----------------------------------------------------------------------------


def quant_mix(items: Iterable[tuple[str, int, int]]) -> tuple[dict[str, dict[str, Any]], float | None]:
    """Per-type {count, bytes, elements, bpw} (largest first) and overall bits per weight,
    from (type name, elements, bytes) per tensor."""
    mix: dict[str, dict[str, Any]] = {}
    for type_name, elements, nbytes in items:
        m = mix.setdefault(type_name, {"count": 0, "bytes": 0, "elements": 0})
        m["count"] += 1
        m["bytes"] += nbytes
        m["elements"] += elements
    for m in mix.values():
        m["bpw"] = 8 * m["bytes"] / m["elements"] if m["elements"] else None
    total_bytes = sum(m["bytes"] for m in mix.values())
    total_elements = sum(m["elements"] for m in mix.values())
    ordered = dict(sorted(mix.items(), key=lambda kv: (-kv[1]["bytes"], kv[0])))
    return ordered, (8 * total_bytes / total_elements if total_elements else None)


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _open_gguf(ctx: InspectContext) -> None:
    try:
        ctx.summary["size"] = ctx.path.stat().st_size
    except OSError:
        pass
    g = _opened(ctx, lambda: open_gguf(ctx.path, strict=False), GGUFFormatError)
    if g is None:
        return
    ctx.gguf = g
    mix, bpw = quant_mix((t.ggml_type.name, t.n_elements, t.nbytes) for t in g.tensors.values())
    ctx.summary.update(
        size=g.file_size, version=g.version, alignment=g.alignment,
        arch=_str_or_none(g.get("general.architecture")), name=_str_or_none(g.get("general.name")),
        kv_count=g.n_kv, tensor_count=g.n_tensors, quant_mix=mix, bpw=bpw,
    )


def _read_config(directory: Path) -> tuple[dict[str, Any] | None, Finding | None]:
    """config.json of a checkpoint directory (bounded read), for the architecture in the summary."""
    path = directory / "config.json"
    try:
        if not path.is_file():
            return None, None
        if path.stat().st_size > MAX_CONFIG_SIZE:
            return None, warning("safetensors.config_json", f"{path}: over {MAX_CONFIG_SIZE} bytes, not read", file=str(path))
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return None, warning("safetensors.config_json", f"{path}: cannot read config.json: {reason}", file=str(path))
    if not isinstance(doc, dict):
        return None, warning("safetensors.config_json", f"{path}: config.json is not a JSON object", file=str(path))
    return doc, None


def _config_arch(config: dict[str, Any] | None) -> str | None:
    if not config:
        return None
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return _str_or_none(config.get("model_type"))


def _opened(ctx: InspectContext, opener: Callable[[], Any], error: type[Exception]) -> Any:
    """The opened file with its problems as findings, or None (the reason a finding) when it cannot be opened."""
    try:
        opened = opener()
    except error as err:
        ctx.findings.append(Finding.from_error(err))
        return None
    ctx.findings.extend(Finding.from_error(p) for p in opened.problems)
    return opened


def _open_checkpoint(ctx: InspectContext) -> None:
    ck = _opened(ctx, lambda: open_checkpoint(ctx.path, strict=False), CheckpointFormatError)
    if ck is None:
        return
    ctx.checkpoint = ck
    config, problem = _read_config(ck.directory)
    if problem:
        ctx.findings.append(problem)
    ctx.cache["config"] = config
    mix, bpw = quant_mix((t.dtype, t.n_elements, t.nbytes) for t in ck.tensors.values())
    ctx.summary.update(
        size=ck.total_size, files=len(ck.files), arch=_config_arch(config),
        tensor_count=len(ck.tensors), quant_mix=mix, bpw=bpw,
    )


def open_context(path: Path, *, strict: bool = False, target: str | None = None, expect: str | None = None) -> InspectContext:
    """Detect the kind, open the file with the hardened reader and turn its problems into findings."""
    kind, problem = detect_kind(path)
    ctx = InspectContext(path=path, kind=kind, target=target, expect=expect, strict=strict)
    ctx.summary.update(file=str(path), kind=kind, dialect=None)
    if problem is not None:
        ctx.findings.append(problem)
    elif kind == "gguf":
        _open_gguf(ctx)
    elif kind == "safetensors":
        _open_checkpoint(ctx)
    return ctx


# --- structure checks beyond what the readers enforce ---------------------------------------------


@register_check("gguf.tensor_layout", kinds=("gguf",), order=10)
def check_gguf_layout(ctx: InspectContext) -> Iterator[Finding]:
    """llama.cpp requires tensor data packed in tensor-info order, each padded to the alignment."""
    g = ctx.gguf
    assert g is not None
    if g.problems or len(g.tensors) != g.n_tensors:
        return  # offsets already reported as broken
    expected = 0
    for t in g.tensors.values():
        rel = t.offset - g.data_start
        if rel != expected:
            yield error(
                "gguf.tensor_layout",
                f"{ctx.path}: tensor {t.name!r} data offset {rel}, expected {expected}: llama.cpp requires tensors "
                "packed in file order with alignment padding — re-convert the file",
                tensor=t.name, offset=rel, expected=expected,
            )
            return
        expected += -(-t.nbytes // g.alignment) * g.alignment
    end = g.data_start + expected
    if g.n_tensors and g.file_size > end:
        yield info(
            "gguf.trailing_bytes",
            f"{ctx.path}: {g.file_size - end} bytes after the last tensor's padded data (ignored by llama.cpp)",
            trailing=g.file_size - end, data_end=end, file_size=g.file_size,
        )


@register_check("gguf.metadata", kinds=("gguf",), order=20)
def check_gguf_metadata(ctx: InspectContext) -> Iterator[Finding]:
    g = ctx.gguf
    assert g is not None
    arch = g.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        yield warning(
            "gguf.architecture",
            f"{ctx.path}: no general.architecture string key; llama.cpp cannot load the file without it — re-convert it",
        )
    if g.n_tensors == 0:
        yield info("gguf.no_tensors", f"{ctx.path}: the file has no tensors (vocab-only GGUF?)")


@register_check("safetensors.index_coverage", kinds=("safetensors",), order=10)
def check_index_coverage(ctx: InspectContext) -> Iterator[Finding]:
    ck = ctx.checkpoint
    assert ck is not None
    if ck.weight_map is not None:
        unlisted = [n for n in ck.tensors if n not in ck.weight_map]
        if unlisted:
            yield warning(
                "safetensors.index_unlisted_tensor",
                f"{ck.index_path}: {len(unlisted)} tensor(s) in the shards are missing from weight_map "
                f"(first {unlisted[0]!r}); loaders that follow the index will not see them — regenerate the index",
                count=len(unlisted), first=unlisted[0],
            )
    if not ck.tensors and not ck.problems:
        yield warning("safetensors.no_tensors", f"{ctx.path}: the checkpoint holds no tensors")

