"""The low-bit super-block types Q2_K and Q3_K and the non-linear IQ4_NL / IQ4_XS.

Quantization is the numba kernels of ``loops.lowbit`` / ``loops.kquants`` / ``loops.lowbit_lanes`` (without an
importance matrix) and ``loops.weighted``
(with one), transcribed from ggml. Dequantization is gguf-py's own (``gguf.quants``): the reference every reader
of these files is compared with, so it is used as it is rather than written again.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import KernelQuantType


class _GgufDequantized(KernelQuantType):
    _cost = 20  # every one searches scales per sub-block: many times a plain type's work per value

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        import gguf.quants

        return gguf.quants.dequantize(np.ascontiguousarray(q), self.ggml_type).astype(np.float32, copy=False)


def _low_bit(ggml_type: GGMLQuantizationType, kernel: str, weighted: tuple[str, tuple[int, ...]],
             layout: str) -> type[_GgufDequantized]:
    """One type of the table below as its `QuantType` (registered by ``ggml_type`` like any other): its numba
    kernel's name, its importance-weighted kernel's name and extra arguments, and its block layout."""
    return type(ggml_type.name, (_GgufDequantized,), {"__doc__": f"Layout: {layout}.", "__module__": __name__,
                                                      "_kernel": kernel, "_weighted": weighted}, ggml_type=ggml_type)


Q2_K = _low_bit(GGMLQuantizationType.Q2_K, "q2_k_kernel", ("q23_k_w_kernel", (2,)),
                "scales[16] (4-bit scale | 4-bit min), qs[64] (2-bit levels), d, dmin (fp16)")
Q3_K = _low_bit(GGMLQuantizationType.Q3_K, "q3_k_kernel", ("q23_k_w_kernel", (3,)),
                "hmask[32] (3rd bits), qs[64] (low 2 bits), 12 bytes of 6-bit signed scales, d (fp16)")
IQ4_NL = _low_bit(GGMLQuantizationType.IQ4_NL, "iq4_kernel", ("iq4_w_kernel", (32,)),
                  "d (fp16), qs[16]: 4-bit indices into the 16 non-linear levels kvalues_iq4nl")
IQ4_XS = _low_bit(GGMLQuantizationType.IQ4_XS, "iq4_kernel", ("iq4_w_kernel", (256,)),
                  "d (fp16), scales_h (uint16), scales_l[4], qs[128]: 6-bit sub-block scales, 4-bit level indices")
