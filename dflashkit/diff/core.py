"""`diff_drafters`: per-tensor differences between any two forms of a drafter, and their report.

Both sides go through `open_drafter`, so every name scheme (HF, llama.cpp, luce, dflash-draft)
meets on canonical tensor ids, GGUF dims come back in numpy order and every type is read as
float32. Tensor pairs are streamed one at a time (peak memory ≈ the largest pair as float32).
Nothing is skipped silently: tensors on one side only, unmapped names, shape mismatches,
unreadable tensors and differences in meaning each get their own list and fail the diff.

The work is split along its concerns: `dflashkit.diff.align` pairs the two drafters' tensors and measures them
(`diff_drafters`), `dflashkit.diff.result` holds what it found, the verdict and the report (`DiffResult`).
This module re-exports their names, so ``dflashkit.diff.core`` still offers every one of them.
"""

from __future__ import annotations

from .align import diff_drafters
from .result import (EXIT_DIFFERENT, EXIT_OK, DiffResult, ExactDiff, InfoItem, OneSided, ShapeMismatch, Side,
                     TensorDiff, Unreadable)

__all__ = [
    "EXIT_DIFFERENT",
    "EXIT_OK",
    "DiffResult",
    "ExactDiff",
    "InfoItem",
    "OneSided",
    "ShapeMismatch",
    "Side",
    "TensorDiff",
    "Unreadable",
    "diff_drafters",
]
