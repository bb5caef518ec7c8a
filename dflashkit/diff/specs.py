"""Do two drafters *mean* the same thing? Field-by-field comparison of two `DrafterSpec`s.

Used by Diff (and Inspect / Parity). Specs are compared as the reader decodes them: target layer
ids are already in the HF convention, so a llama.cpp file storing ``[2, 9]`` and a Luce file storing
``[1, 8]`` agree. Floats are compared at float32 precision because GGUF stores them as float32.

A GGUF dialect does not store every field (llama.cpp has no ``num_target_layers``, Luce no
``embedding_scale``): a field only one side can carry is never a difference in meaning, only
information. `carried_fields` says which fields a loaded drafter carries.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, Collection

import numpy as np

from ..spec import DrafterSpec

if TYPE_CHECKING:
    from ..drafters import DrafterFile

#: fields that differ between forms of one drafter by nature (directory name vs general.name, dtype)
BY_NATURE = frozenset({"name", "torch_dtype"})
#: facts about the target, set only "when known": None is unknown, not absent
WHEN_KNOWN = frozenset({"num_target_layers", "vocab_size"})
#: provenance, not meaning: the reference's recorded causal rule is read by inspect and parity, the file's flag compared
_IGNORED = frozenset({"target_layer_ids_defaulted", "reference_causal_layers"})
_SPEC_FIELDS = {f.name: f for f in fields(DrafterSpec)}
_FLOAT_FIELDS = frozenset(n for n, f in _SPEC_FIELDS.items() if str(f.type).startswith("float"))


@dataclass(frozen=True)
class SpecDifference:
    field: str
    a: Any  # None = not set (or not carried, see `note`)
    b: Any
    meaningful: bool  # True: the drafters behave differently; False: information only
    note: str = ""


def _default(name: str) -> Any:
    f = _SPEC_FIELDS[name]
    return None if f.default is MISSING else f.default


def _same(name: str, a: Any, b: Any) -> bool:
    if name in _FLOAT_FIELDS and a is not None and b is not None:
        return bool(np.float32(a) == np.float32(b))
    return a == b


def compare_specs(
    a: DrafterSpec,
    b: DrafterSpec,
    *,
    carried_a: Collection[str] | None = None,
    carried_b: Collection[str] | None = None,
) -> list[SpecDifference]:
    """Differences between two specs, in field order.

    ``carried_a`` / ``carried_b``: the fields each side can store (None = all, as an HF config).
    A field carried by one side only is reported (as information) when that side sets it to a
    non-default value; so are fields in `BY_NATURE`, and `WHEN_KNOWN` fields only one side knows.
    """
    out: list[SpecDifference] = []
    for name in _SPEC_FIELDS:
        if name in _IGNORED:
            continue
        in_a = carried_a is None or name in carried_a
        in_b = carried_b is None or name in carried_b
        va, vb = getattr(a, name), getattr(b, name)
        if not (in_a or in_b):
            continue
        if not (in_a and in_b):
            value, holder, other = (va, "A", "B") if in_a else (vb, "B", "A")
            if value != _default(name):
                out.append(
                    SpecDifference(
                        name, va if in_a else None, vb if in_b else None, False,
                        f"only {holder} stores {name}; {other}'s format has no key for it",
                    )
                )
            continue
        if name in WHEN_KNOWN and (va is None) != (vb is None):
            holder = "A" if va is not None else "B"
            out.append(SpecDifference(name, va, vb, False, f"only {holder} knows {name}"))
            continue
        if _same(name, va, vb):
            continue
        if name in BY_NATURE:
            note = "differs between forms by nature"
        elif name in _FLOAT_FIELDS:
            note = "compared at float32 precision (GGUF stores float32)"
        elif name == "target_layer_ids":
            note = "compared in the HF convention (decoder-layer ids)"
        else:
            note = ""
        out.append(SpecDifference(name, va, vb, name not in BY_NATURE, note))
    return out


def carried_fields(drafter: DrafterFile) -> frozenset[str] | None:
    """The DrafterSpec fields ``drafter``'s format stores (None: all of them — an HF config)."""
    if drafter.dialect is None:
        return None
    dialect = drafter.dialect
    # An extension key (a field that runtime has no key for, written by dflashkit so translations keep
    # it) counts only where present: a file made by that runtime's own converter simply lacks it.
    carried = {
        ks.field for ks in dialect.keys
        if ks.field in _SPEC_FIELDS
        and (not getattr(ks, "extension", False) or dialect.key(ks, drafter.architecture) in drafter.metadata)
    }
    # architecture follows from the DFlash 2 keys; general.name is written by every converter
    carried |= {"architecture", "name"}
    # the reader fills vocab_size from the tokenizer or the selector codebook when the file has one
    carried.add("vocab_size")
    if dialect.stores_target_count(drafter.architecture):
        carried.add("num_target_layers")  # Luce's Gemma script stores the target's layer count
    return frozenset(carried)
