"""llama.cpp file types (``general.file_type``), gathered from the quant types' modules.

Each type's module in ``dflashkit.codecs.types`` declares the file types whose default type it is (`FileType`:
llama.cpp name, gguf-py's `LlamaFileType`, ``llama_ftype_get_default_type``, where it is listed, whether it needs an
importance matrix, whether llama.cpp's converter writes it itself, llama-quantize's aliases). The converter's
``--outtype`` list, ``dflash-quantize``'s TYPE list, the release's type list and the CLI choices are all derived here.
"""

from __future__ import annotations

from .codecs import QUANT_TYPES
from .quant_types import FileType

__all__ = ["FileType", "ALL_FILE_TYPES", "FILE_TYPE_ALIASES", "QUANTIZE_FILE_TYPES", "NEEDS_IMATRIX",
           "CONVERT_OUTTYPES", "CONVERT_POLICY_OUTTYPES", "OUTTYPE_CHOICES", "outtype_file_type"]

_DECLARED = [ft for qt in QUANT_TYPES.values() for ft in qt.file_types]
for _what, _values in (("name", [ft.name for ft in _DECLARED]), ("rank", [ft.rank for ft in _DECLARED]),
                       ("alias", [a for ft in _DECLARED for a in ft.aliases])):
    _twice = sorted({str(v) for v in _values if _values.count(v) > 1})
    if _twice:  # two types' modules claim one file type, place or spelling: the lists would be ambiguous
        raise RuntimeError(f"file type {_what} declared twice in dflashkit/codecs/types: {', '.join(_twice)}")

#: Every file type dflashkit writes, by llama.cpp name, as listed (larger `FileType.rank` first).
ALL_FILE_TYPES: dict[str, FileType] = {ft.name: ft for ft in sorted(_DECLARED, key=lambda ft: -ft.rank)}

#: llama-quantize's aliases (its QUANT_OPTIONS): a TYPE given so means the file type named here
FILE_TYPE_ALIASES: dict[str, str] = {alias: ft.name for ft in ALL_FILE_TYPES.values() for alias in ft.aliases}

#: ``dflash-quantize`` TYPE values, in the order its messages list them: the quantized types, then the float ones.
QUANTIZE_FILE_TYPES: tuple[str, ...] = tuple(
    [n for n, ft in ALL_FILE_TYPES.items() if ft.quantize_target and ft.quantized]
    + [n for n, ft in ALL_FILE_TYPES.items() if ft.quantize_target and not ft.quantized])

#: file types llama-quantize writes only with an importance matrix (tensor_requires_imatrix)
NEEDS_IMATRIX: frozenset[str] = frozenset(n for n, ft in ALL_FILE_TYPES.items() if ft.needs_imatrix)

#: ``dflash-convert --outtype`` values the converter writes itself (llama.cpp's converter rules).
CONVERT_OUTTYPES: tuple[str, ...] = tuple(n.lower() for n, ft in ALL_FILE_TYPES.items() if ft.converter_writes)
#: ``--outtype`` values that go through llama-quantize's per-tensor policy: the quantized TYPE values the converter
#: does not write itself, less those that need an importance matrix (the converter takes none).
CONVERT_POLICY_OUTTYPES: tuple[str, ...] = tuple(
    n.lower() for n in QUANTIZE_FILE_TYPES
    if ALL_FILE_TYPES[n].quantized and n.lower() not in CONVERT_OUTTYPES and n not in NEEDS_IMATRIX)
#: The ``--outtype`` choice list (``auto`` = the checkpoint's own 16-bit type).
OUTTYPE_CHOICES: tuple[str, ...] = ("auto", *CONVERT_OUTTYPES, *CONVERT_POLICY_OUTTYPES)


def outtype_file_type(outtype: str) -> FileType:
    """``--outtype`` value (lower case) → its file type row."""
    return ALL_FILE_TYPES[outtype.upper()]
