"""`dflash-parity --dump`: the first round's exact tensors of both sides, written as the "Parity dump" format
(``docs/formats.md``) so another tool can recompute the comparison from the same inputs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..files import atomic_output
from ..runtime import LoadInfo
from .result import ParityResult


@dataclass
class FirstRound:
    """The first round's exact tensors per side (for --dump)."""

    context: dict[str, torch.Tensor]
    blocks: dict[str, torch.Tensor]
    noises: dict[str, torch.Tensor]
    steps: dict[str, Any]
    positions: torch.Tensor




def _np(t: torch.Tensor, dtype: Any) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().cpu().numpy() if dtype == np.float32 else t.detach().cpu().numpy(),
                                dtype=dtype)


def write_dump(path: Path, result: ParityResult, first: FirstRound, specs: dict[str, Any], *,
                force: bool = False) -> None:
    steps = first.steps
    arrays: dict[str, np.ndarray] = {
        "target_hidden": _np(first.context["reference"], np.float32),
        "block_ids": _np(first.blocks["reference"], np.int64),
        "position_ids": _np(first.positions, np.int64),
        "noise_embedding": _np(first.noises["reference"], np.float32),
        "hidden_reference": _np(steps["reference"].hidden, np.float32),
        "hidden_candidate": _np(steps["candidate"].hidden, np.float32),
    }
    if result.prompt_ids is not None:  # a target model ran on these tokens
        arrays["context_ids"] = np.asarray([result.prompt_ids], dtype=np.int64)
    if steps["reference"].logits is not None:
        arrays["logits_reference"] = _np(steps["reference"].logits, np.float32)
        arrays["logits_candidate"] = _np(steps["candidate"].logits, np.float32)
    # Extra keys (allowed by the format) only where the candidate's inputs differ from the reference's.
    for key, value in (("target_hidden", first.context["candidate"]), ("block_ids", first.blocks["candidate"]),
                       ("noise_embedding", first.noises["candidate"])):
        cand = _np(value, arrays[key].dtype)
        if cand.shape != arrays[key].shape or not np.array_equal(cand, arrays[key]):
            arrays[key + "_candidate"] = cand
    meta = {
        "reference": _side_meta(result.reference, specs["reference"]),
        "candidate": _side_meta(result.candidate, specs["candidate"]),
        "target": result.target,
        "mode": result.mode,
        "device": result.device,
        "dtype": result.dtype,
        "seed": result.seed,
        "block_size": result.block_size,
        "logits": "draft logits for block positions 1..B-1 after output multiplier and softcap",
    }
    arrays["meta"] = np.array(json.dumps(meta))
    with atomic_output(path, force=force) as f:  # a file object: np.savez appends .npz to other names
        np.savez(f, **arrays)


def _side_meta(info: LoadInfo, s: Any) -> dict[str, Any]:
    """The dump's description of one side (``s``: its drafter's spec)."""
    return {
        "path": info.path, "kind": info.kind, "dialect": info.dialect, "architecture": info.architecture,
        "family": info.family_name, "tensor_types": info.tensor_types, "matmul": info.matmul, "target_layer_ids": list(s.target_layer_ids),
        "mask_token_id": s.mask_token_id, "embedding_scale": s.embedding_scale, "logit_scale": s.logit_scale,
        "final_logit_softcapping": s.final_logit_softcapping,
    }
