"""The three GGUF dialects of a DFlash drafter, as tables.

One `Dialect` per runtime lineage (facts in docs/dialects.md): architecture strings, metadata
keys with their GGUF value types, tensor names and the tap-id convention. The same table drives
writing (`encode_metadata`, `Dialect.gguf_name`) and reading (`decode_metadata`,
`Dialect.canonical_name`, `detect_dialect`) — there is no per-dialect branching elsewhere.

Canonical tensor ids are z-lab's HF names without a ``model.`` prefix (``fc.weight``,
``layers.3.self_attn.q_proj.weight``); the DFlash 2 codebooks always carry ``.weight``.

The package: `table` (what a dialect is: `Dialect`, `KeySpec`, tap ids), `shared_rows` (the rows several tables are
built from), one module per dialect table (`llama_cpp`, `luce`, `dflash_draft`), and `metadata` (encoding and
decoding through a table). Here: the registry of the three, by name and by architecture string. Everything is
importable from ``dflashkit.dialects`` itself.
"""

from __future__ import annotations

from ..errors import DFlashError
from .dflash_draft import DFLASH_DRAFT
from .llama_cpp import LLAMA_CPP
from .luce import LUCE
from .metadata import all_keys, decode_metadata, encode_metadata, spec_from_gguf_metadata, with_spec
from .shared_rows import LLAMA_CPP_ONLY_TENSORS
from .table import Dialect, KeySpec, tap_ids_from_llama_cpp, tap_ids_to_llama_cpp

__all__ = [
    "DEFAULT_DIALECT",
    "DFLASH_DRAFT",
    "DIALECTS",
    "LLAMA_CPP",
    "LLAMA_CPP_ONLY_TENSORS",
    "LUCE",
    "Dialect",
    "KeySpec",
    "all_keys",
    "decode_metadata",
    "detect_dialect",
    "encode_metadata",
    "get_dialect",
    "spec_from_gguf_metadata",
    "tap_ids_from_llama_cpp",
    "tap_ids_to_llama_cpp",
    "with_spec",
]

DIALECTS: dict[str, Dialect] = {d.name: d for d in (LLAMA_CPP, LUCE, DFLASH_DRAFT)}
DEFAULT_DIALECT = LLAMA_CPP


def get_dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise DFlashError(f"unknown dialect '{name}' (known: {', '.join(DIALECTS)})") from None


def detect_dialect(architecture: str | None) -> Dialect | None:
    """Dialect of a GGUF from its ``general.architecture`` (None when it is no DFlash drafter)."""
    for dialect in DIALECTS.values():
        if architecture in dialect.architectures and dialect.name != "luce":
            return dialect
    # "dflash-draft" is also accepted by the Luce loader, but its keys are the dflash-draft lineage's.
    return LUCE if architecture in LUCE.architectures else None
