"""dflash-parity's gates: the thresholds the user gives, or — when none is given — the default for the files'
precision, so ``dflash-parity CHECKPOINT FILE.gguf`` fails a file that does not draft what its checkpoint drafts.

The default is a table by the weaker of the two files' weight precision (the lowest bits per weight of any tensor
type, from `dflashkit.quant_types`): a float file (F32 / F16 / BF16) of a float checkpoint keeps the drafter's
logits (the conversion only rounds to the stored type), an 8-bit file nearly so. Below 8 bits the loss is the
publisher's choice (a 4-bit drafter may still draft well — `dflash-accept` measures what it costs in τ), so there is
no default gate: give ``--threshold-top1`` / ``--threshold-kl``. Without a target head there are no logits, and the
default gates the cosine of the drafters' output hidden states on the seeded random inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from gguf import GGMLQuantizationType

from ..quant_types import block_size, type_size

FLOAT_TYPE_NAMES = ("F64", "F32", "F16", "BF16")
INDEX_TYPE_NAMES = ("I8", "I16", "I32", "I64", "BOOL")
NO_DEFAULT = "below 8 bits"  # the source of a gate asked for by default where the table has none


@dataclass(frozen=True)
class Gate:
    """What a parity result must hold: top-1 agreement at least ``top1``, mean KL at most ``kl`` (with logits),
    the output hidden states' cosine at least ``cosine`` (without); ``source``: "given" (by the user), "none", or
    the precision class whose default it is."""

    top1: float | None = None
    kl: float | None = None
    cosine: float | None = None
    source: str = "none"

    @property
    def given(self) -> bool:
        return self.source == "given"

    def label(self, option: str) -> str:
        """How a failure names the bound: the user's option, or the default and how to change it."""
        return f"(the default for {self.source} files: {option} sets another, --no-default-gate none)"


#: precision class → its default gate (top-1, KL with a target head; cosine without)
DEFAULT_GATES: dict[str, Gate] = {
    "float": Gate(top1=0.99, kl=0.01, cosine=0.999, source="float"),
    "8-bit": Gate(top1=0.97, kl=0.02, cosine=0.99, source="8-bit"),
}


def precision_class(tensor_types: Mapping[str, int]) -> str | None:
    """"float" when every tensor is a float type, "8-bit" when the weakest type stores at least 8 bits a weight,
    else None (below 8 bits, or a type this table does not know)."""
    weights = [n for n in tensor_types if n.upper() not in INDEX_TYPE_NAMES]  # a d2t map's ids are not weights
    if not weights:
        return None
    if all(name.upper() in FLOAT_TYPE_NAMES for name in weights):
        return "float"
    bits = []
    for name in weights:
        try:
            t = GGMLQuantizationType[name.upper()]
        except KeyError:
            return None
        bits.append(8 * type_size(t) / block_size(t))
    return "8-bit" if min(bits) >= 8 else None


def resolve_gate(reference_types: Mapping[str, int], candidate_types: Mapping[str, int], threshold_top1: float | None,
                 threshold_kl: float | None, has_logits: bool, default: bool) -> Gate:
    """The gate of one comparison: the given thresholds, else (``default``) the weaker file's default, else none."""
    if threshold_top1 is not None or threshold_kl is not None:
        return Gate(threshold_top1, threshold_kl, None, "given")
    classes = [precision_class(reference_types), precision_class(candidate_types)]
    if not default:
        return Gate()
    if None in classes:
        return Gate(source=NO_DEFAULT)
    table = DEFAULT_GATES["8-bit" if "8-bit" in classes else "float"]
    return Gate(table.top1, table.kl, None, table.source) if has_logits else Gate(None, None, table.cosine,
                                                                                    table.source)
