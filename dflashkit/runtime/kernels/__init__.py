"""Quantized-weight kernels: dequantize ggml blocks in torch and multiply with the weights kept quantized.

- ``dequantize_torch(data, ggml_type, shape)``: raw blocks (uint8 tensor, any device) -> float32, bit-identical
  to ``gguf.quants.dequantize``, for every type whose module in ``dflashkit.codecs.types`` has ``dequantize_torch``
  (``TORCH_DEQUANT``).
- ``QuantizedWeight``: a linear weight as raw blocks ``[out_features, row_bytes]`` on its device.
- ``qmatmul(x, w)``: ``x @ W.T`` through Triton on CUDA, Metal on MPS, the reference path elsewhere;
  ``qmatmul_path(device, w)`` names the path.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType

from .dispatch import qmatmul, qmatmul_path, reference_qmatmul
from .reference import TORCH_DEQUANT, dequantize_torch
from .weight import QuantizedWeight

__all__ = [
    "GGMLQuantizationType", "QuantizedWeight", "TORCH_DEQUANT", "dequantize_torch", "qmatmul", "qmatmul_path",
    "reference_qmatmul",
]
