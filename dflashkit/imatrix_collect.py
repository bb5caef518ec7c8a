"""``dflash-imatrix``: the importance matrix of a DFlash drafter — what llama-imatrix cannot make, because a drafter
runs on its target's hidden states.

The drafter runs in the reference runtime exactly as ``dflash-accept`` runs it: real greedy draft–verify rounds
with its target on the prompts, the target's hidden states at the tap layers as the drafter's context. A hook on
every linear layer of the drafter adds, per input column, the squares of every input row it multiplies (context
and noise rows alike: ``fc`` sees the target's concatenated hidden states, the attention and MLP projections the
drafter's own) and counts the rows — llama-imatrix's statistic (``in_sum2``, ``counts``; sums kept in float64 here
and stored as float32). The file is llama-imatrix's GGUF format (``general.type = imatrix``,
``imatrix.datasets`` / ``imatrix.chunk_count`` / ``imatrix.chunk_size``, ``<tensor>.in_sum2`` and
``<tensor>.counts``), tensors named as the drafter's GGUF names them (its dialect; llama.cpp's for an HF folder),
so ``llama-quantize --imatrix`` and ``dflash-quantize --imatrix`` both take it. A chunk is one draft round;
``chunk_size`` is the drafter's block.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import DFlashError, UsageError


@dataclass
class ImatrixResult:
    """What a collection gathered: per GGUF tensor name, the input squares' sums and the rows counted."""

    sums: dict[str, np.ndarray]  # float64 [in_features]
    counts: dict[str, int]
    rounds: int
    block_size: int
    prompts: int
    dataset: str
    drafter: str


def _gguf_names(drafter: str | os.PathLike) -> Callable[[str], str]:
    """canonical id -> the GGUF name of the file to be quantized (the drafter's own dialect, llama.cpp's for an HF
    folder)."""
    from .dialects import DEFAULT_DIALECT, detect_dialect
    from .drafters import open_drafter

    with open_drafter(drafter) as d:
        arch = getattr(d, "architecture", None)
        dialect = (detect_dialect(arch) if isinstance(arch, str) else None) or DEFAULT_DIALECT
    return dialect.gguf_name


def collect_imatrix(
    drafter: str | os.PathLike, target: str | os.PathLike, prompts: str | os.PathLike | None = None, *,
    max_prompts: int | None = None, max_new_tokens: int = 64, seed: int = 0, device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> ImatrixResult:
    """Run the drafter's real draft rounds with ``target`` on ``prompts`` (module doc) and gather its statistic."""
    import torch

    from .accept.prompts import load_prompts
    from .accept.serving_only import prepare_prompts
    from .runtime import HFTarget, load_drafter
    from .runtime.linear import Linear
    from .runtime.speculative import check_pair, default_stop_ids, speculative_generate

    say = progress or (lambda message: None)
    if max_new_tokens < 2:
        raise UsageError(f"--max-new-tokens {max_new_tokens}: give at least 2 (a draft round needs room)")
    if not Path(target).is_dir():
        raise UsageError(f"--target {target}: give the target's HF model folder (its hidden states feed the drafter)")
    prompt_list = load_prompts(prompts, limit=max_prompts)
    gguf_name = _gguf_names(drafter)
    say(f"loading target {target}")
    runner = HFTarget(target, device=device)
    # every prompt rendered and checked before any round, as dflash-accept and a release's serving prepare them:
    # prompt + new tokens within the target's context, ids inside its vocabulary (a 5,000-token ask of a
    # 4,096-context target is refused now)
    prompt_ids = prepare_prompts(runner, prompt_list, max_new_tokens=max_new_tokens).ids
    say(f"loading drafter {drafter}")
    model = load_drafter(drafter, device=device)
    head = runner.head()
    check_pair(model, runner, head, where=f"drafter {drafter}")
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    hooks = []

    def hook(name: str) -> Callable[..., None]:
        def add(module: Any, inputs: tuple[Any, ...]) -> None:
            x = inputs[0].detach().to(torch.float64).reshape(-1, inputs[0].shape[-1])
            sums[name] = sums[name] + (x * x).sum(dim=0) if name in sums else (x * x).sum(dim=0)
            counts[name] = counts.get(name, 0) + int(x.shape[0])
        return add

    for module_name, module in model.named_modules():
        if isinstance(module, Linear):
            hooks.append(module.register_forward_pre_hook(hook(gguf_name(f"{module_name}.weight"))))
    stops = default_stop_ids(runner)
    rounds = 0
    try:
        with torch.no_grad():
            for i, (p, ids) in enumerate(zip(prompt_list, prompt_ids)):
                r = speculative_generate(model, runner, ids, max_new_tokens=max_new_tokens, head=head,
                                         stop_token_ids=stops, seed=seed + i)
                rounds += r.rounds
                say(f"prompt {i + 1}/{len(prompt_list)} ({p.id}): {r.rounds} draft round(s)")
    finally:
        for h in hooks:
            h.remove()
    if not sums:
        raise DFlashError(f"{drafter}: no linear layer of the drafter ran — nothing to measure")
    bad = next((n for n, s in sums.items() if not bool(torch.isfinite(s).all())), None)
    if bad is not None:
        raise DFlashError(f"{drafter}: the inputs of {bad} hold NaN / inf values — the drafter does not run cleanly "
                          "on this target; check it with dflash-parity")
    dataset = Path(prompts).name if prompts else "dflashkit built-in prompts"
    return ImatrixResult({n: s.cpu().numpy() for n, s in sums.items()}, counts, rounds, int(model.block_size),
                         len(prompt_list), dataset, Path(drafter).name)


def write_imatrix(result: ImatrixResult, out: str | os.PathLike, *, force: bool = False,
                  inputs: tuple[str | os.PathLike, ...] = ()) -> Path:
    """``result`` as llama-imatrix's GGUF (module doc), written atomically (`io.gguf_writer.write_gguf`)."""
    from gguf import GGMLQuantizationType, GGUFValueType

    from .files import check_output, check_outside_inputs
    from .io.gguf_writer import MetadataEntry, TensorToWrite, write_gguf

    out_path = check_output(out, inputs=list(inputs), force=force)
    check_outside_inputs(out_path, inputs, what="write the importance matrix to another folder")
    stored: dict[str, np.ndarray] = {}
    for name in sorted(result.sums):
        with np.errstate(over="ignore"):  # checked here, by name: never numpy's raw warning
            sums = np.ascontiguousarray(result.sums[name], dtype=np.float32).reshape(1, -1)
        if not np.isfinite(sums).all():
            raise DFlashError(f"{result.drafter}: the sums of squares of {name}'s inputs overflow float32 (largest "
                              f"{float(np.max(result.sums[name])):.3g}; an importance matrix stores float32) — the "
                              "drafter's activations are out of range on these prompts; check it with dflash-parity")
        stored[name] = sums
    metadata = [MetadataEntry("general.type", "imatrix", GGUFValueType.STRING),
                MetadataEntry("imatrix.datasets", [result.dataset], GGUFValueType.ARRAY, GGUFValueType.STRING),
                MetadataEntry("imatrix.chunk_count", result.rounds, GGUFValueType.UINT32),
                MetadataEntry("imatrix.chunk_size", result.block_size, GGUFValueType.UINT32),
                MetadataEntry("dflashkit.imatrix.drafter", result.drafter, GGUFValueType.STRING)]
    tensors = []
    for name, sums in stored.items():
        count = np.array([[float(result.counts[name])]], dtype=np.float32)
        for suffix, data in ((".in_sum2", sums), (".counts", count)):
            tensors.append(TensorToWrite(f"{name}{suffix}", data.shape, GGMLQuantizationType.F32,
                                         lambda data=data: [data]))
    write_gguf(out_path, "imatrix", metadata, tensors, force=force, progress=False)
    return out_path
