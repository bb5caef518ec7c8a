"""Quantized-weight kernels: dequantize ggml blocks in torch and multiply with the weights kept quantized.

- ``dequantize_torch(data, ggml_type, shape)``: raw blocks (uint8 tensor, any device) -> float32, bit-identical
  to ``gguf.quants.dequantize`` (Q8_0, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, plus
  F32 / F16 / BF16).
- ``QuantizedWeight``: a linear weight as raw blocks ``[out_features, row_bytes]`` on its device.
- ``qmatmul(x, w)``: ``x @ W.T`` through Triton on CUDA, Metal on MPS, the reference path elsewhere;
  ``qmatmul_path(device, w)`` names the path.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType

from .dispatch import qmatmul, qmatmul_path, reference_qmatmul
from .reference import TORCH_DEQUANT, dequantize_torch
from . import reference_lowbit  # noqa: F401  (registers Q4_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS in TORCH_DEQUANT)
from .weight import QuantizedWeight

__all__ = [
    "GGMLQuantizationType", "QuantizedWeight", "TORCH_DEQUANT", "dequantize_torch", "qmatmul", "qmatmul_path",
    "reference_qmatmul",
]
