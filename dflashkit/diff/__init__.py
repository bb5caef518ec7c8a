"""`dflash-diff`: per-tensor diff reports between any two forms of a drafter (HF, GGUF of any dialect/type).

Library entry: ``diff_drafters(a, b) -> DiffResult``; ``result.report()`` gives a
`dflashkit.reporting.Report` (text / JSON / Markdown / HTML) and ``result.exit_code(threshold,
allow_missing)`` the CI verdict. `compare_specs` is the reusable "same meaning?" check.
"""

from .core import (
    EXIT_DIFFERENT,
    EXIT_OK,
    DiffResult,
    InfoItem,
    OneSided,
    ShapeMismatch,
    Side,
    TensorDiff,
    Unreadable,
    diff_drafters,
)
from .specs import BY_NATURE, WHEN_KNOWN, SpecDifference, carried_fields, compare_specs
from .stats import TensorStats, tensor_stats

__all__ = [
    "BY_NATURE",
    "EXIT_DIFFERENT",
    "EXIT_OK",
    "DiffResult",
    "InfoItem",
    "OneSided",
    "ShapeMismatch",
    "Side",
    "SpecDifference",
    "TensorDiff",
    "TensorStats",
    "Unreadable",
    "WHEN_KNOWN",
    "carried_fields",
    "compare_specs",
    "diff_drafters",
    "tensor_stats",
]
