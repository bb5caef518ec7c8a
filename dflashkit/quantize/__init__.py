"""dflash-quantize: the file-level command (`gguf_file.quantize_gguf`) and llama-quantize's per-tensor policy
(`policy`). The per-type codecs live in `dflashkit.codecs` (below ``io``); they are re-exported here so that
``from dflashkit.quantize import quantize, dequantize`` keeps working.
"""

from __future__ import annotations

from dflashkit.codecs import (
    BF16,
    F16,
    F32,
    Q4_0,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    QUANT_TYPES,
    GGMLQuantizationType,
    QuantType,
    dequantize,
    f32_to_bf16_bits,
    f32_to_f16_bits,
    get_num_threads,
    get_quant_type,
    quantize,
    set_num_threads,
)

__all__ = [
    "GGMLQuantizationType", "QUANT_TYPES", "QuantType", "get_quant_type", "quantize", "dequantize",
    "f32_to_f16_bits", "f32_to_bf16_bits", "get_num_threads", "set_num_threads",
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
]
