"""dflash-quantize: the file-level command (`gguf_file.quantize_gguf`) and llama-quantize's per-tensor policy
(`policy`). The per-type codecs live in `dflashkit.codecs` (below ``io``; one module per type in ``codecs/types``,
found through `get_quant_type` / `QUANT_TYPES`); their functions are re-exported here so that
``from dflashkit.quantize import quantize, dequantize`` keeps working.
"""

from __future__ import annotations

from dflashkit.codecs import (
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
]
