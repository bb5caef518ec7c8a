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
        FileType("Q4_K_M", F.MOSTLY_Q4_K_M, Q.Q4_K),
        FileType("Q4_K_S", F.MOSTLY_Q4_K_S, Q.Q4_K),
    )
}

#: ``dflash-quantize`` TYPE values, in the order its messages list them.
QUANTIZE_FILE_TYPES: tuple[str, ...] = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "F16", "BF16")

#: ``dflash-convert --outtype`` values the converter writes itself (llama.cpp's converter rules).
CONVERT_OUTTYPES: tuple[str, ...] = ("f32", "f16", "q8_0", "bf16")
#: ``--outtype`` values that go through llama-quantize's per-tensor policy.
CONVERT_POLICY_OUTTYPES: tuple[str, ...] = ("q4_k_m", "q4_k_s", "q5_k_m", "q5_k_s", "q6_k")
#: The ``--outtype`` choice list (``auto`` = the checkpoint's own 16-bit type).
OUTTYPE_CHOICES: tuple[str, ...] = ("auto", "f32", "f16", "bf16", "q8_0", *CONVERT_POLICY_OUTTYPES)


def outtype_file_type(outtype: str) -> FileType:
    """``--outtype`` value (lower case) → its file type row."""
    return ALL_FILE_TYPES[outtype.upper()]
