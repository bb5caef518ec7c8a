"""ggml tensor types and their sizes: the one place that reads gguf-py's ``GGML_QUANT_SIZES``.

Every reader, writer, codec and policy asks here for a type's block size (values per block; 1 for the plain
float and integer types) and type size (bytes per block), and whether it is a block-quantized type
(ggml_is_quantized); and what a llama.cpp file type is (`FileType`: each quant type's module in
``dflashkit.codecs.types`` declares its own, `dflashkit.filetypes` gathers them).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

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


@dataclass(frozen=True)
class FileType:
    """A llama.cpp file type (``LLAMA_FTYPE_*``): its name, ``general.file_type`` value (gguf-py's
    `LlamaFileType`) and default ggml type (``llama_ftype_get_default_type``), declared by that type's module.

    ``rank`` orders the lists a user reads (larger first: about ten times its bits per weight);
    ``needs_imatrix``: llama-quantize writes it only with an importance matrix (tensor_requires_imatrix);
    ``converter_writes``: llama.cpp's converter writes it itself (``--outtype``), not through the quantize policy;
    ``aliases``: other TYPE spellings llama-quantize takes for it (its QUANT_OPTIONS: Q4_K is Q4_K_M);
    ``quantize_target``: a ``dflash-quantize`` TYPE (F32 is only the converter's)."""

    name: str
    ftype: LlamaFileType
    default_type: GGMLQuantizationType
    rank: int
    needs_imatrix: bool = False
    converter_writes: bool = False
    aliases: tuple[str, ...] = ()
    quantize_target: bool = True

    @property
    def file_type(self) -> int:
        return int(self.ftype)

    @property
    def quantized(self) -> bool:
        return is_quantized(self.default_type)
