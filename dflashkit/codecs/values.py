"""Values a conversion cannot carry over, counted per tensor: NaN / ±inf inputs, and finite values an F16 output
turns into ±inf (|x| ≥ 65520 rounds past 65504, F16's largest finite value).

`dflash-convert` and `dflash-quantize` count them on the rows they convert (a tensor copied byte for byte is not
read: its values do not change), warn with the tensor names, and under ``--strict`` refuse at the first one — before
the output file exists.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from dflashkit.errors import DFlashError

#: the smallest magnitude that rounds to ±inf in F16 (round to nearest even: 65504 + half an F16 step)
F16_OVERFLOW = np.float32(65520.0)


def _count(x: np.ndarray, to_f16: bool) -> tuple[int, int]:
    """(non-finite values, finite values beyond F16) of float32 ``x``."""
    nonfinite = x.size - int(np.count_nonzero(np.isfinite(x)))
    if not to_f16:
        return nonfinite, 0
    beyond = int(np.count_nonzero(np.abs(x) >= F16_OVERFLOW))  # ±inf counted here too
    return nonfinite, beyond - int(np.count_nonzero(np.isinf(x)))


@dataclass
class ValueCounts:
    """Per-tensor counts, shared by the threads that convert a file's chunks."""

    source: str
    strict: bool = False
    nonfinite: dict[str, int] = field(default_factory=dict)
    f16_overflow: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, x: np.ndarray, *, to_f16: bool = False) -> None:
        """Count a float32 chunk of tensor ``name`` (``to_f16``: the output is F16)."""
        self._record(name, *_count(x, to_f16))

    def add_bf16_to_f16(self, name: str, bits: np.ndarray) -> None:
        """Count a BF16 chunk (uint16 bits) bound for F16 from its bits alone, in one pass over half the bytes of
        a float32 count: a magnitude's bits at or above 0x7F80 are NaN / inf; a finite one at or above 0x4780
        (65536; the BF16 value below it is 65280) rounds past F16's 65504."""
        from ._kernels import bf16_f16_specials  # numba: only the path that already runs the numba kernel

        nonfinite, overflow = bf16_f16_specials(np.ascontiguousarray(bits).view(np.uint16).reshape(-1))
        self._record(name, int(nonfinite), int(overflow))

    def _record(self, name: str, nonfinite: int, overflow: int) -> None:
        if not (nonfinite or overflow):
            return
        if self.strict:
            what = f"{nonfinite} NaN or infinite value(s)" if nonfinite else f"{overflow} value(s) beyond ±65504"
            raise DFlashError(f"{self.source}: tensor '{name}' has {what} — refusing under --strict (without it: "
                              "written, with a warning)")
        with self._lock:
            if nonfinite:
                self.nonfinite[name] = self.nonfinite.get(name, 0) + nonfinite
            if overflow:
                self.f16_overflow[name] = self.f16_overflow.get(name, 0) + overflow

    def warnings(self) -> list[str]:
        out = [f"{name}: {n} NaN or infinite value(s), written as they are (a runtime computes NaN from them)"
               for name, n in self.nonfinite.items()]
        out += [f"{name}: {n} value(s) beyond ±65504 became ±inf in F16 (use bf16 or f32 for this tensor)"
                for name, n in self.f16_overflow.items()]
        return out
