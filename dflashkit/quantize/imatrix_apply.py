"""How llama-quantize puts an importance matrix to use on a file (``llama_model_quantize_impl``), and what dflashkit
refuses on top: the entry of every converted tensor (looked up by name, its length the row length times the experts
— a token embedding of another length is quantized without, as llama.cpp does), the tensors whose type cannot do
without one (``tensor_requires_imatrix``: Q2_K in a Q2_K_S file), and ``n_gqa`` for the mixes that depend on it.

Stricter than llama-quantize, because a wrong matrix quantizes silently there: an entry for a tensor the file does
not have (the target's matrix given for its drafter) and a tensor without an entry whose type would use one are
one-line errors naming the tensor — unless ``--include-weights`` / ``--exclude-weights`` dropped entries on purpose.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from gguf import GGMLQuantizationType

from ..bounds import escape_name
from ..codecs import get_quant_type
from ..errors import DFlashError
from ..filetypes import NEEDS_IMATRIX, FileType
from .imatrix_read import ImportanceMatrix
from .policy import Category, tensor_category


def gqa_of(gguf_file: Any, arch: str) -> int:
    """hparams.n_gqa() of layer 0: heads / kv heads (kv heads default to heads; 0 kv heads give 0)."""
    def first(value: Any) -> int | None:
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    n_head = first(gguf_file.get(f"{arch}.attention.head_count"))
    n_kv = first(gguf_file.get(f"{arch}.attention.head_count_kv"))
    n_kv = n_head if n_kv is None else n_kv
    return n_head // n_kv if n_head and n_kv else 0


def requires_imatrix(name: str, new_type: GGMLQuantizationType, ft: FileType) -> bool:
    """tensor_requires_imatrix for the file types offered here: a tensor of a `NEEDS_IMATRIX` file at the file's
    own type (Q2_K in Q2_K_S; after its fallback: a file whose every tensor falls back needs none, as in
    llama-quantize), never the token embedding or the output."""
    return (ft.name in NEEDS_IMATRIX and new_type == ft.default_type
            and tensor_category(name) not in (Category.TOKEN_EMBD, Category.OUTPUT))


def _entry_name(name: str) -> str:
    return escape_name(name) if name else "'' (a tensor named '.in_sum2': an entry with an empty name)"


def check_imatrix(matrix: ImportanceMatrix, ft: FileType, infos: Sequence[Any],
                  choices: Sequence[Any]) -> dict[str, np.ndarray]:
    """The weights of each converted tensor, or a one-line error naming the tensor (module doc). Every entry is
    checked against its tensor's length before a value is read, so what is read is bounded by the model."""
    if not matrix.entries:
        raise DFlashError(f"{matrix.source}: " + ("--include-weights / --exclude-weights left no entry of it"
                          if matrix.filtered else "holds no importance-matrix entry (no <tensor>.in_sum2 and "
                          "<tensor>.counts pair) — llama-quantize would quantize without one, saying only "
                          "'loaded 0 importance matrix entries'") + "; make it with dflash-imatrix")
    by_name = {t.name: t for t in infos}
    foreign = sorted(n for n in matrix.entries if n not in by_name)
    if foreign:
        raise DFlashError(f"{matrix.source}: has weights for {_entry_name(foreign[0])}, a tensor this file does not "
                          f"have{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''} — is it another "
                          "model's importance matrix (the target's)? dflash-imatrix makes a drafter's")
    ignored: set[str] = set()
    for name, entry in matrix.entries.items():
        info = by_name[name]
        want = (info.dims[0] if info.dims else 1) * (info.dims[2] if len(info.dims) > 2 else 1)
        if entry.n_values != want:
            if tensor_category(name) is not Category.TOKEN_EMBD:
                raise DFlashError(f"{matrix.source}: tensor {escape_name(name)}: {entry.n_values} weights for a "
                                  f"tensor of {want} columns — the importance matrix of another model or version")
            ignored.add(name)  # llama-quantize: "tok_embd should be ignored in this case"
    out: dict[str, np.ndarray] = {}
    weighted: list[str] = []  # tensors quantized to a type that uses weights
    for info, choice in zip(infos, choices):
        if choice.new_type == choice.old_type:
            continue  # copied as it is: llama-quantize does not look
        uses_weights = get_quant_type(choice.new_type).uses_weights
        if uses_weights:
            weighted.append(info.name)
        if info.name not in matrix.entries or info.name in ignored:
            if requires_imatrix(info.name, choice.new_type, ft):
                raise DFlashError(f"{matrix.source}: no weights for {escape_name(info.name)}, which {ft.name} "
                                  f"quantizes to {choice.new_type.name} — that needs them (llama-quantize refuses it "
                                  "too)")
            # a token_embd is a lookup table: no importance matrix has weights for it (llama-imatrix, like
            # dflash-imatrix, collects matmul inputs only) — quantized without, as llama-quantize does
            if not matrix.filtered and uses_weights and tensor_category(info.name) is not Category.TOKEN_EMBD:
                raise DFlashError(f"{matrix.source}: no weights for {escape_name(info.name)} (quantized to "
                                  f"{choice.new_type.name}) — make the importance matrix of this drafter "
                                  "(dflash-imatrix), or leave the tensor out on purpose with --exclude-weights / "
                                  "--include-weights")
            continue
        if len(info.dims) > 2 and info.dims[2] > 1:
            raise DFlashError(f"{matrix.source}: tensor {escape_name(info.name)} has {info.dims[2]} experts — "
                              "dflashkit applies an importance matrix to drafters, which have none")
        out[info.name] = matrix.values(info.name)
    for name in matrix.entries:
        if name not in out:  # llama-quantize refuses a non-finite value in any entry, used or not
            matrix.scan(name)
    if weighted and not any(n in out for n in weighted):
        raise DFlashError(f"{matrix.source}: covers none of the {len(weighted)} tensor(s) this file quantizes with "
                          f"an importance matrix (0 of {len(weighted)}) — it would change nothing; check "
                          "--include-weights / --exclude-weights, or make the drafter's (dflash-imatrix)")
    return out
