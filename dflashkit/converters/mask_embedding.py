"""MiMo-style drafters: ``mask_embedding.pt`` beside the checkpoint, as llama.cpp's converter reads it.

Such a drafter has no embeddings of its own; its mask token's row of the target's embedding table
is untrained, and the checkpoint ships the vector to use instead. llama.cpp's ``DFlashModel``
(``generate_extra_tensors``) checks the file against ``dflash_config.mask_token_id`` and the hidden
size, then writes — before every checkpoint tensor — the target's output head as ``output.weight``
(its ``lm_head.weight``, or its embeddings when the target ties them; not when the drafter has its
own ``lm_head``) and ``token_embd.weight`` = the target's embeddings (the drafter's own
``embed_tokens`` when it has one) with that row replaced. This module does the same with the same
checks and messages.

Why torch is imported here (lazily, only for this file): ``mask_embedding.pt`` is a torch zip
pickle. Reading it any other way means unpickling by hand, which dflashkit never does;
``torch.load(weights_only=True)`` is torch's restricted loader (tensors and plain containers only).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import DFlashError
from ..files import read_json, side_file
from ..io.safetensors_reader import SafetensorsCheckpoint, SafetensorsTensor, open_checkpoint
from ..spec import DrafterSpec

MASK_EMBEDDING_FILE = "mask_embedding.pt"
_EMBEDDINGS = "model.embed_tokens.weight"


@dataclass
class GeneratedTensor:
    """A tensor the checkpoint does not hold as such: its canonical id, numpy shape, stored dtype tag
    and either a source tensor to stream (``source``) or its data (``data``, in that dtype)."""

    canonical: str
    shape: tuple[int, ...]
    dtype: str
    source: SafetensorsTensor | None = None
    data: np.ndarray | None = None


def _load_mask(path: Path) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        raise DFlashError(
            f"{path}: reading it needs PyTorch (pip install torch) — it is a torch pickle, and dflashkit only "
            "reads those through torch.load(weights_only=True)"
        ) from None
    try:
        mask = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for anything but plain tensors/containers, RuntimeError for a bad zip
        raise DFlashError(f"{path}: not a weights-only torch file ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(mask, dict) or "mask_token_id" not in mask or "embedding" not in mask:
        raise DFlashError(f"{path}: expected a dict with 'mask_token_id' and 'embedding'")
    return mask


def _as_numpy(tensor: Any, dtype: str) -> np.ndarray:
    """A torch tensor cast to a safetensors dtype tag (torch's rounding, as llama.cpp's ``.to``) as numpy
    (BF16 as uint16 bits)."""
    import torch

    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}.get(dtype)
    if torch_dtype is None:
        raise DFlashError(f"target embeddings have dtype {dtype}; expected F32, F16, BF16 or F64")
    cast = tensor.detach().to(torch_dtype)
    if dtype == "BF16":
        return cast.view(torch.int16).numpy().view(np.uint16)
    return cast.numpy()


def _target_tensor(target_dir: Path, checkpoint: SafetensorsCheckpoint, name: str) -> SafetensorsTensor:
    t = checkpoint.tensors.get(name)
    if t is None:
        raise DFlashError(f"{target_dir}: Target tensor {name!r} was not found in safetensors")
    return t


def read_mask_embedding(directory: Path, spec: DrafterSpec) -> Any:
    """The mask token's embedding (a torch tensor [hidden], as stored) of a drafter with ``mask_embedding.pt``,
    checked against the spec's mask token id and hidden size as llama.cpp's converter checks it; None when
    the directory has no such file. (The runtime reads it here too: one reader for the file.)"""
    path = Path(directory) / MASK_EMBEDDING_FILE
    if not side_file(path):
        return None
    mask = _load_mask(path)
    stored_id = mask["mask_token_id"]
    stored_id = int(stored_id.item()) if hasattr(stored_id, "item") else stored_id
    if spec.mask_token_id is None or stored_id != spec.mask_token_id:
        raise DFlashError(f"{path}: mask_embedding.pt mask_token_id does not match dflash_config")
    if tuple(getattr(mask["embedding"], "shape", ())) != (spec.hidden_size,):
        raise DFlashError(f"{path}: mask_embedding.pt has an unexpected embedding shape")
    return mask["embedding"]


def mask_embedding_tensors(
    directory: Path,
    spec: DrafterSpec,
    drafter_tensors: dict[str, SafetensorsTensor],
    target: str | Path | None,
    read_drafter: Callable[[str], np.ndarray],
) -> tuple[list[GeneratedTensor], list[str]] | None:
    """(tensors to write first, drafter canonical ids they replace) for a drafter with
    ``mask_embedding.pt``; None when there is no such file."""
    vector = read_mask_embedding(directory, spec)
    if vector is None:
        return None
    path = directory / MASK_EMBEDDING_FILE
    mask_id = spec.mask_token_id
    assert mask_id is not None
    target_dir = Path(target) if target is not None else None
    needs_target = DFlashError(
        f"{path}: mask_embedding.pt requires --target with the target's HF directory (its embeddings and output head)"
    )
    if spec.vocab_size is None and (target_dir is None or not target_dir.is_dir()):
        raise needs_target
    if spec.vocab_size is None or not 0 <= mask_id < spec.vocab_size:
        raise DFlashError(f"{path}: mask_embedding.pt mask_token_id is outside the vocabulary")
    if target_dir is None or not target_dir.is_dir():
        raise needs_target
    checkpoint = open_checkpoint(target_dir, strict=True)
    try:
        generated: list[GeneratedTensor] = []
        replaced: list[str] = []
        if "embed_tokens.weight" in drafter_tensors:
            emb_source = drafter_tensors["embed_tokens.weight"]
            embeddings = np.array(read_drafter("embed_tokens.weight"))
            replaced.append("embed_tokens.weight")
        else:
            emb_source = _target_tensor(target_dir, checkpoint, _EMBEDDINGS)
            embeddings = np.array(checkpoint.array(_EMBEDDINGS))
        if "lm_head.weight" not in drafter_tensors:
            config = read_json(target_dir / "config.json")
            if not isinstance(config, dict):
                raise DFlashError(f"{target_dir / 'config.json'}: expected a JSON object at the top level")
            text = config.get("text_config")
            config = {**config, **(text if isinstance(text, dict) else {})}
            head_name = _EMBEDDINGS if config.get("tie_word_embeddings", False) else "lm_head.weight"
            head = _target_tensor(target_dir, checkpoint, head_name)
            generated.append(GeneratedTensor("lm_head.weight", tuple(head.shape), head.dtype, source=head))
        if tuple(embeddings.shape) != (spec.vocab_size, spec.hidden_size):
            raise DFlashError(f"{target_dir}: Target token embedding shape does not match the DFlash draft")
        # MiMo's target mask row is untrained; the drafter provides its own vector
        embeddings[mask_id] = _as_numpy(vector, emb_source.dtype)
        generated.append(GeneratedTensor("embed_tokens.weight", tuple(embeddings.shape), emb_source.dtype, data=embeddings))
        return generated, replaced
    finally:
        checkpoint.close()  # the head is streamed later by path, not through this object
