"""llama.cpp file types (``general.file_type``), once, on gguf-py's `gguf.LlamaFileType`.

One row per file type dflashkit writes: its llama.cpp name, its `LlamaFileType` (whose value is
``general.file_type``) and its default ggml type (``llama_ftype_get_default_type``). The converter's
``--outtype`` list, ``dflash-quantize``'s TYPE list and the CLI choices are all derived from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType, LlamaFileType

from .quant_types import is_quantized

Q = GGMLQuantizationType
F = LlamaFileType


@dataclass(frozen=True)
class FileType:
    """A llama.cpp file type (``LLAMA_FTYPE_*``): its name, ``general.file_type`` value and default type."""

    name: str
    ftype: LlamaFileType
    default_type: GGMLQuantizationType

    @property
    def file_type(self) -> int:
        return int(self.ftype)

    @property
    def quantized(self) -> bool:
        return is_quantized(self.default_type)


#: Every file type dflashkit writes, by llama.cpp name.
ALL_FILE_TYPES: dict[str, FileType] = {
    ft.name: ft
    for ft in (
        FileType("F32", F.ALL_F32, Q.F32),
        FileType("F16", F.MOSTLY_F16, Q.F16),
        FileType("BF16", F.MOSTLY_BF16, Q.BF16),
        FileType("Q8_0", F.MOSTLY_Q8_0, Q.Q8_0),
        FileType("Q6_K", F.MOSTLY_Q6_K, Q.Q6_K),
        FileType("Q5_K_M", F.MOSTLY_Q5_K_M, Q.Q5_K),
        FileType("Q5_K_S", F.MOSTLY_Q5_K_S, Q.Q5_K),
        FileType("Q5_1", F.MOSTLY_Q5_1, Q.Q5_1),
        FileType("Q5_0", F.MOSTLY_Q5_0, Q.Q5_0),
        FileType("Q4_K_M", F.MOSTLY_Q4_K_M, Q.Q4_K),
        FileType("Q4_K_S", F.MOSTLY_Q4_K_S, Q.Q4_K),
        FileType("Q4_1", F.MOSTLY_Q4_1, Q.Q4_1),
        FileType("Q4_0", F.MOSTLY_Q4_0, Q.Q4_0),
        FileType("IQ4_NL", F.MOSTLY_IQ4_NL, Q.IQ4_NL),
        FileType("IQ4_XS", F.MOSTLY_IQ4_XS, Q.IQ4_XS),
        FileType("Q3_K_L", F.MOSTLY_Q3_K_L, Q.Q3_K),
        FileType("Q3_K_M", F.MOSTLY_Q3_K_M, Q.Q3_K),
        FileType("Q3_K_S", F.MOSTLY_Q3_K_S, Q.Q3_K),
        FileType("Q2_K", F.MOSTLY_Q2_K, Q.Q2_K),
        FileType("Q2_K_S", F.MOSTLY_Q2_K_S, Q.Q2_K),
    )
}

#: llama-quantize's aliases (its QUANT_OPTIONS): a TYPE given so means the file type named here
FILE_TYPE_ALIASES: dict[str, str] = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

#: ``dflash-quantize`` TYPE values, in the order its messages list them.
QUANTIZE_FILE_TYPES: tuple[str, ...] = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S",
                                        "Q4_1", "Q4_0", "IQ4_NL", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K",
                                        "Q2_K_S", "F16", "BF16")

#: file types llama-quantize writes only with an importance matrix (tensor_requires_imatrix)
NEEDS_IMATRIX: frozenset[str] = frozenset({"Q2_K_S"})

#: ``dflash-convert --outtype`` values the converter writes itself (llama.cpp's converter rules).
CONVERT_OUTTYPES: tuple[str, ...] = ("f32", "f16", "q8_0", "bf16")
#: ``--outtype`` values that go through llama-quantize's per-tensor policy: the quantized TYPE values the converter
#: does not write itself, less those that need an importance matrix (the converter takes none).
CONVERT_POLICY_OUTTYPES: tuple[str, ...] = tuple(
    n.lower() for n in QUANTIZE_FILE_TYPES
    if ALL_FILE_TYPES[n].quantized and n.lower() not in CONVERT_OUTTYPES and n not in NEEDS_IMATRIX)
#: The ``--outtype`` choice list (``auto`` = the checkpoint's own 16-bit type).
OUTTYPE_CHOICES: tuple[str, ...] = ("auto", "f32", "f16", "bf16", "q8_0", *CONVERT_POLICY_OUTTYPES)


def outtype_file_type(outtype: str) -> FileType:
    """``--outtype`` value (lower case) → its file type row."""
    return ALL_FILE_TYPES[outtype.upper()]
