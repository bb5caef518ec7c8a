"""BF16: the upper 16 bits of float32, as ggml_fp32_to_bf16_row_ref (NaN to (u >> 16) | 64, else round to nearest
even) by the numba loop of `codecs.float16`; read back by shifting the bits up."""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..blocks import FloatType
from ..float16 import bf16_bits_to_f32, f32_to_bf16_bits


class BF16(FloatType, ggml_type=Q.BF16):
    encode, decode = f32_to_bf16_bits, bf16_bits_to_f32
    needs_numba = True  # the conversion is a numba kernel
    torch_view = "bfloat16"
    file_types = (FileType("BF16", F.MOSTLY_BF16, Q.BF16, rank=159, converter_writes=True),)
