"""ggml tensor types and their sizes: the one place that reads gguf-py's ``GGML_QUANT_SIZES``.

Every reader, writer, codec and policy asks here for a type's block size (values per block; 1 for the plain
float and integer types) and type size (bytes per block), and whether it is a block-quantized type
(ggml_is_quantized).
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

#: type id as stored in a GGUF → the type, for every type gguf-py knows the size of
KNOWN_TYPES: dict[int, GGMLQuantizationType] = {int(t): t for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}


def sizes(ggml_type: GGMLQuantizationType) -> tuple[int, int]:
    """(values per block, bytes per block)."""
    return GGML_QUANT_SIZES[ggml_type]


def block_size(ggml_type: GGMLQuantizationType) -> int:
    return GGML_QUANT_SIZES[ggml_type][0]


def type_size(ggml_type: GGMLQuantizationType) -> int:
    return GGML_QUANT_SIZES[ggml_type][1]


def is_quantized(ggml_type: GGMLQuantizationType) -> bool:
    """ggml_is_quantized: block types (F32/F16/BF16 and the integer types have a block of 1)."""
    return GGML_QUANT_SIZES[ggml_type][0] > 1
