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

from typing import Any

from ..errors import DFlashError
from ..families import FAMILIES, DrafterFamily
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
    "family_dialect",
    "unstored_defaults",
    "get_dialect",
    "spec_from_gguf_metadata",
    "tap_ids_from_llama_cpp",
    "tap_ids_to_llama_cpp",
    "with_spec",
]

DIALECTS: dict[str, Dialect] = {d.name: d for d in (LLAMA_CPP, LUCE, DFLASH_DRAFT)}
DEFAULT_DIALECT = LLAMA_CPP


def _family_table(family: DrafterFamily) -> Dialect:
    """llama.cpp's table for a family with a GGUF architecture of its own, from the family's rows."""
    keys = tuple(
        KeySpec(field, key, type_, sub, required="required" in words, leading="leading" in words,
                after_file_type="after_file_type" in words)
        for field, key, type_, sub, words in ((*row[:4], row[4].split()) for row in family.gguf_keys)
    )
    return Dialect(name=LLAMA_CPP.name, architectures=(family.gguf_architecture,), keys=keys,
                   tensor_names=dict(family.gguf_tensor_names), tap_offset=LLAMA_CPP.tap_offset, needs_tokenizer=True,
                   description=f"upstream llama.cpp LLM_ARCH_{family.gguf_architecture.upper()}")


#: general.architecture → each family that has an architecture of its own, and its llama.cpp table
_FAMILY_OF_ARCHITECTURE: dict[str, DrafterFamily] = {f.gguf_architecture: f for f in FAMILIES if f.gguf_architecture}
FAMILY_DIALECTS: dict[str, Dialect] = {a: _family_table(f) for a, f in _FAMILY_OF_ARCHITECTURE.items()}


def unstored_defaults(architecture: str | None) -> dict[str, Any]:
    """Spec fields a GGUF of ``architecture`` stores under no key, as its family fixes them (`gguf_defaults`: an
    EAGLE-3 file's block = llama.cpp's default n-max + 1); empty for the DFlash architectures."""
    family = _FAMILY_OF_ARCHITECTURE.get(architecture or "")
    return dict(family.gguf_defaults) if family is not None else {}


def family_dialect(family: DrafterFamily, dialect: Dialect, source: str = "") -> Dialect:
    """The table a drafter of ``family`` is written with when ``dialect`` is asked for: the family's own for a
    family with a GGUF architecture of its own (llama.cpp's dialect only), else ``dialect``."""
    if not family.gguf_architecture:
        return dialect
    if dialect.name != LLAMA_CPP.name:
        where = f"{source}: " if source else ""
        raise DFlashError(f"{where}{family.label(None)} drafters have one GGUF dialect, llama.cpp's "
                          f"(architecture '{family.gguf_architecture}'): use --dialect {LLAMA_CPP.name}")
    return FAMILY_DIALECTS[family.gguf_architecture]


def get_dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise DFlashError(f"unknown dialect '{name}' (known: {', '.join(DIALECTS)})") from None


def detect_dialect(architecture: str | None) -> Dialect | None:
    """Dialect of a GGUF from its ``general.architecture`` (None when it is no drafter)."""
    if architecture in FAMILY_DIALECTS:
        return FAMILY_DIALECTS[architecture]
    for dialect in DIALECTS.values():
        if architecture in dialect.architectures and dialect.name != "luce":
            return dialect
    # "dflash-draft" is also accepted by the Luce loader, but its keys are the dflash-draft lineage's.
    return LUCE if architecture in LUCE.architectures else None
