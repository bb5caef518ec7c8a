"""The low-bit super-block types Q2_K and Q3_K and the non-linear IQ4_NL / IQ4_XS.

Quantization is the numba kernels of ``_kernels_lowbit`` (without an importance matrix) and ``_kernels_weighted``
(with one), transcribed from ggml. Dequantization is gguf-py's own (``gguf.quants``): the reference every reader
of these files is compared with, so it is used as it is rather than written again.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .base import KernelQuantType


class _GgufDequantized(KernelQuantType):
    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        import gguf.quants

        return gguf.quants.dequantize(np.ascontiguousarray(q), self.ggml_type).astype(np.float32, copy=False)


class Q2_K(_GgufDequantized, ggml_type=GGMLQuantizationType.Q2_K):
    """Layout: scales[16] (4-bit scale | 4-bit min), qs[64] (2-bit levels), d, dmin (fp16)."""

    _kernel = "q2_k_kernel"
    _weighted = ("q2_k_w_kernel", ())
    _cost = 20


class Q3_K(_GgufDequantized, ggml_type=GGMLQuantizationType.Q3_K):
    """Layout: hmask[32] (3rd bits), qs[64] (low 2 bits), 12 bytes of 6-bit signed scales, d (fp16)."""

    _kernel = "q3_k_kernel"
    _weighted = ("q3_k_w_kernel", ())
    _cost = 20


class IQ4_NL(_GgufDequantized, ggml_type=GGMLQuantizationType.IQ4_NL):
    """Layout: d (fp16), qs[16]: 4-bit indices into the 16 non-linear levels kvalues_iq4nl."""

    _kernel = "iq4_kernel"
    _weighted = ("iq4_w_kernel", (32,))
    _cost = 20


class IQ4_XS(_GgufDequantized, ggml_type=GGMLQuantizationType.IQ4_XS):
    """Layout: d (fp16), scales_h (uint16), scales_l[4], qs[128]: 6-bit sub-block scales, 4-bit level indices."""

    _kernel = "iq4_kernel"
    _weighted = ("iq4_w_kernel", (256,))
    _cost = 20
