"""`dflash-parity`: does the candidate file still draft the same tokens as the reference?

Both drafters (HF dirs or GGUFs of any dialect/type) run in the runtime on identical inputs, round
after round with their own KV caches cropped as in ``dflash_generate``, and their outputs are
compared: weight parity (the Diff report, summarised), then logit parity per block position —
top-1 agreement, top-5 overlap, KL(ref‖cand), |Δlogit| — and the accepted-prefix length the
candidate's greedy draft would get if the reference's draft were the truth.

Where the inputs come from:

- ``target`` an HF directory: the target runs with transformers on the prompt; the token stream
  is the prompt plus the target's greedy continuation (what greedy speculative decoding outputs),
  each drafter gets the tap features of *its own* ``target_layer_ids`` and rounds advance by what
  the target accepts of the reference's draft;
- ``target`` a GGUF: its ``token_embd`` / ``output`` give embeddings and lm_head, the context
  hidden states are seeded random, and each round accepts the reference's whole draft;
- no target: hidden states and embeddings are seeded random and only the drafters' output hidden
  states are compared — logits need a target head.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .diff import diff_drafters
from .errors import DFlashError, UsageError
from .files import atomic_output, check_output
from .reporting import Column, Field, Notes, Report, Table, verdict
from .target_rules import Target, check_runtime_fit
from .runtime.dflash import RMSNorm
from .runtime import DFlashDraftModel, HFTarget, LoadInfo, TargetHead, load_drafter, load_target_head
from .runtime.load import VERIFY_MODE
from .runtime.target import DEFAULT_PROMPT, GreedyStream

EXIT_OK = 0
EXIT_FAILED = 1
CONTEXT_LEN = 32  # context positions of the first round when the hidden states are random
TOP_K = 5

MODES = {
    "hf-target": "target run with transformers: real tap hidden states, embeddings and lm_head",
    "gguf-target": "target GGUF: its token_embd / output give embeddings and lm_head; context hidden states are "
    "seeded random; each round accepts the reference's whole draft",
    "no-target": "no target: hidden states and embeddings are seeded random, so parity is measured on the drafters' "
    "output hidden states — logits need a target head (pass --target)",
}


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogitStats:
    """Logit agreement over ``n`` draft positions (rows)."""

    n: int
    top1: float  # fraction of rows whose argmax agrees
    top5: float  # mean |top5(ref) ∩ top5(cand)| / 5
    kl_mean: float  # KL(ref ‖ cand) in nats
    kl_p99: float
    kl_max: float
    max_abs: float  # max |Δlogit|
    rms: float  # RMS |Δlogit| over every logit

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class HiddenStats:
    """Output hidden-state agreement over ``n`` rows."""

    n: int
    rel_rms: float  # ‖Δ‖ / ‖ref‖
    max_abs: float
    cosine: float  # mean per-row cosine similarity

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: rows of logits whose float64 figures are computed at once: each is a row of its own, and a few rows keep the
#: float64 temporaries of a 152 k vocabulary at a few MB (all 15 rows at once took ~120 MB of the run's peak)
_LOGIT_ROWS_AT_ONCE = 4


def _logit_rows(ref: torch.Tensor, cand: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-row figures for [n, vocab] logits (float64), a few rows at a time."""
    parts = [_logit_rows_block(ref[i : i + _LOGIT_ROWS_AT_ONCE], cand[i : i + _LOGIT_ROWS_AT_ONCE])
             for i in range(0, ref.shape[0], _LOGIT_ROWS_AT_ONCE)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _logit_rows_block(ref: torch.Tensor, cand: torch.Tensor) -> dict[str, np.ndarray]:
    r, c = ref.double(), cand.double()
    lr, lc = torch.log_softmax(r, -1), torch.log_softmax(c, -1)
    kl = (lr.exp() * (lr - lc)).sum(-1).clamp_min(0.0)  # tiny negative values are rounding
    k = min(TOP_K, r.shape[-1])
    tr, tc = r.topk(k, -1).indices, c.topk(k, -1).indices
    overlap = (tr[:, :, None] == tc[:, None, :]).any(-1).sum(-1).double() / k
    d = (r - c).abs()
    return {
        "top1": (r.argmax(-1) == c.argmax(-1)).double().numpy(),
        "top5": overlap.numpy(),
        "kl": kl.numpy(),
        "max_abs": d.max(-1).values.numpy(),
        "sq": (d * d).mean(-1).numpy(),
    }


def _logit_stats(rows: dict[str, np.ndarray]) -> LogitStats:
    kl = rows["kl"]
    return LogitStats(
        n=int(kl.size),
        top1=float(rows["top1"].mean()),
        top5=float(rows["top5"].mean()),
        kl_mean=float(kl.mean()),
        kl_p99=float(np.percentile(kl, 99)),
        kl_max=float(kl.max()),
        max_abs=float(rows["max_abs"].max()),
        rms=float(math.sqrt(rows["sq"].mean())),
    )


def _hidden_rows(ref: torch.Tensor, cand: torch.Tensor) -> dict[str, np.ndarray]:
    r, c = ref.double(), cand.double()
    d = r - c
    cos = (r * c).sum(-1) / (r.norm(dim=-1) * c.norm(dim=-1)).clamp_min(1e-300)
    return {
        "d2": (d * d).sum(-1).numpy(),
        "r2": (r * r).sum(-1).numpy(),
        "max_abs": d.abs().max(-1).values.numpy(),
        "cos": cos.numpy(),
    }


def _hidden_stats(rows: dict[str, np.ndarray]) -> HiddenStats:
    r2 = rows["r2"].sum()
    return HiddenStats(
        n=int(rows["d2"].size),
        # NaN stays NaN (a NaN reference must never read as "rel RMS 0")
        rel_rms=float(math.sqrt(rows["d2"].sum() / r2)) if r2 > 0 else (0.0 if rows["d2"].sum() == 0 else math.nan),
        max_abs=float(rows["max_abs"].max()),
        cosine=float(rows["cos"].mean()),
    )


def _select(rows: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in rows.items()}


def accepted_prefix(draft: Sequence[int], truth: Sequence[int]) -> int:
    """How many leading tokens of ``draft`` match ``truth`` (greedy verification)."""
    n = 0
    for a, b in zip(draft, truth):
        if a != b:
            break
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundResult:
    index: int
    start: int  # position of the anchor
    context: int  # context positions fed this round
    reference_tokens: list[int] | None
    candidate_tokens: list[int] | None
    candidate_accepted: int | None  # prefix of the candidate's draft equal to the reference's
    reference_accepted: int | None  # prefix of the reference's draft the target accepts (hf-target)
    produced: int  # tokens the round advanced by


@dataclass
class ParityResult:
    reference: LoadInfo
    candidate: LoadInfo
    mode: str  # "hf-target" | "gguf-target" | "no-target"
    target: str | None
    device: str
    dtype: str
    seed: int
    block_size: int
    rounds: list[RoundResult]
    per_position: list[tuple[int, LogitStats]]  # block position (1..B-1) → stats over rounds
    overall: LogitStats | None
    hidden_per_position: list[tuple[int, HiddenStats]]  # block position (0..B-1)
    hidden_overall: HiddenStats
    weights: Any = None  # dflashkit.diff.DiffResult, or None when skipped
    prompt_ids: list[int] | None = None
    dump: str | None = None

    @property
    def has_logits(self) -> bool:
        return self.overall is not None

    @property
    def accepted_mean(self) -> float | None:
        acc = [r.candidate_accepted for r in self.rounds if r.candidate_accepted is not None]
        return float(np.mean(acc)) if acc else None

    def failures(self, threshold_top1: float | None = None, threshold_kl: float | None = None) -> list[str]:
        """One phrase per failed gate; empty when the candidate passes."""
        if (threshold_top1 is not None or threshold_kl is not None) and self.overall is None:
            return ["no logits to gate on (no target head) — pass --target"]
        out = []
        figures = [self.hidden_overall.rel_rms, self.hidden_overall.cosine]
        if self.overall is not None:
            figures += [self.overall.kl_mean, self.overall.rms]
        if not all(math.isfinite(x) for x in figures):  # NaN / Inf outputs are an error finding, gate or not
            out.append("the drafters' outputs hold NaN/Inf values (check the weights with dflash-diff)")
        if threshold_top1 is not None and self.overall is not None and not self.overall.top1 >= threshold_top1:
            out.append(f"top-1 agreement {self.overall.top1:.2%} < --threshold-top1 {threshold_top1:.2%}")
        if threshold_kl is not None and self.overall is not None and not self.overall.kl_mean <= threshold_kl:
            out.append(f"mean KL {self.overall.kl_mean:.3g} > --threshold-kl {threshold_kl:.3g}")
        return out

    def exit_code(self, threshold_top1: float | None = None, threshold_kl: float | None = None) -> int:
        return EXIT_FAILED if self.failures(threshold_top1, threshold_kl) else EXIT_OK

    def report(self, threshold_top1: float | None = None, threshold_kl: float | None = None) -> Report:
        return _build_report(self, threshold_top1, threshold_kl)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


class _Inputs:
    """The token stream, context features and noise rows of every round, shared by both drafters.

    ``feats`` maps a side to a function ``(start, end) -> [1, end - start, taps × hidden]``.
    """

    def __init__(self, head: TargetHead | None, first_start: int, *, tokens: list[int] | None = None,
                 stream: GreedyStream | None = None, feats: dict[str, Callable[[int, int], torch.Tensor]],
                 noise: torch.Tensor | None = None) -> None:
        self.head, self.first_start, self.stream, self.feats, self.noise = head, first_start, stream, feats, noise
        self._tokens = tokens

    @property
    def has_truth(self) -> bool:
        """True when a target decides what it accepts (the stream is its greedy continuation)."""
        return self.stream is not None

    def tokens(self, end: int) -> list[int]:
        """The first ``end`` tokens of the stream."""
        if self.stream is not None:
            self.stream.ensure_tokens(end)
            return self.stream.tokens[:end]
        assert self._tokens is not None
        return self._tokens[:end]


def _hf_inputs(target: HFTarget, head: TargetHead, models: dict[str, DFlashDraftModel], prompt: str | None,
               prompt_ids: Sequence[int] | None) -> _Inputs:
    ids = list(prompt_ids) if prompt_ids is not None else target.encode(prompt or DEFAULT_PROMPT)
    if not ids:
        raise UsageError("the prompt is empty — give --prompt text or --prompt-ids")
    vocab = int(target.model.config.get_text_config().vocab_size)
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise UsageError(f"--prompt-ids: id {bad[0]} is outside the target vocabulary (0..{vocab - 1})")
    stream = target.stream(ids, {i for m in models.values() for i in m.spec.target_layer_ids})
    # Each drafter reads the layers *it* was trained on: a file with shifted taps shows up here.
    feats = {side: functools.partial(stream.features, m.spec.target_layer_ids) for side, m in models.items()}
    return _Inputs(head, len(ids), stream=stream, feats=feats)


def _random_inputs(head: TargetHead | None, models: dict[str, DFlashDraftModel], rounds: int, block: int,
                   seed: int) -> _Inputs:
    g = torch.Generator().manual_seed(seed)
    ref = models["reference"].spec
    length = CONTEXT_LEN + rounds * block + 1
    # Target hidden states are O(1)–O(10) per channel; fc + hidden_norm make the scale immaterial.
    table = torch.randn(1, length, ref.fc_input_width, generator=g)
    vocab = head.vocab_size if head is not None else (ref.vocab_size or 1)
    tokens = torch.randint(0, vocab, (length,), generator=g).tolist()
    noise = None
    if head is None:  # one row per anchor, and the mask row (the same for every mask position)
        noise = torch.randn(length + 1, ref.hidden_size, generator=g) * 0.05

    def feats(start: int, end: int) -> torch.Tensor:
        return table[:, start:end]

    return _Inputs(head, CONTEXT_LEN, tokens=tokens, feats={"reference": feats, "candidate": feats}, noise=noise)


def _check_pair(ref: DFlashDraftModel, cand: DFlashDraftModel, mode: str) -> None:
    a, b = ref.spec, cand.spec
    for name, what in (("hidden_size", "hidden size"), ("block_size", "block size")):
        if getattr(a, name) != getattr(b, name):
            raise DFlashError(f"the drafters differ in {what} ({getattr(a, name)} vs {getattr(b, name)}): "
                              "they cannot run on the same inputs")
    if ref.first_draft_slot != cand.first_draft_slot:
        raise DFlashError(f"the drafters differ in sample_from_anchor ({ref.first_draft_slot == 0} vs "
                          f"{cand.first_draft_slot == 0}): their block slots predict different tokens")
    if mode != "hf-target" and a.n_taps != b.n_taps:
        raise DFlashError(f"the drafters tap {a.n_taps} vs {b.n_taps} target layers: random hidden states cannot "
                          "feed both — pass --target HF_DIR so each gets its own taps")
    if mode != "no-target":
        for side, s in (("reference", a), ("candidate", b)):
            if s.mask_token_id is None:
                raise DFlashError(f"the {side} drafter has no mask_token_id, so its block cannot be embedded")


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def run_parity(
    reference: str | os.PathLike,
    candidate: str | os.PathLike,
    *,
    target: str | os.PathLike | None = None,
    prompt: str | None = None,
    prompt_ids: Sequence[int] | None = None,
    rounds: int = 1,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    dump: str | os.PathLike | None = None,
    keep_quantized: bool = False,
    weights: bool = True,
    force: bool = False,
) -> ParityResult:
    """Run both drafters on the same inputs for ``rounds`` draft rounds and compare them."""
    if rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {rounds}")
    if prompt is not None and prompt_ids is not None:
        raise UsageError("give --prompt or --prompt-ids, not both")
    hf_target = target is not None and Path(target).is_dir()
    if (prompt is not None or prompt_ids is not None) and not hf_target:
        raise UsageError("--prompt / --prompt-ids need --target as an HF model directory (a GGUF target only lends "
                         "its embeddings and lm_head; without a target the hidden states are random)")
    if dump is not None:
        dump = Path(dump)
        # checked now, not after a long run; the dump must never replace a file parity reads
        dump = check_output(dump, inputs=[reference, candidate, target], force=force, label="--dump")

    models = {
        # packed: weights stay in their file type (unpacked per matmul, same float32 values): a few GB less
        "reference": load_drafter(reference, device=device, dtype=dtype, keep_quantized=keep_quantized, packed=True),
        "candidate": load_drafter(candidate, device=device, dtype=dtype, keep_quantized=keep_quantized, packed=True),
    }
    ref_model = models["reference"]
    block = ref_model.spec.block_size
    mode = "hf-target" if hf_target else "gguf-target" if target is not None else "no-target"
    _check_pair(ref_model, models["candidate"], mode)

    runner: HFTarget | None = None
    if hf_target:
        runner = HFTarget(target, device=device)  # type: ignore[arg-type]
        head: TargetHead | None = runner.head(dtype=dtype)
    else:
        head = (load_target_head(target, device=device, dtype=dtype, keep_quantized=keep_quantized, packed=True)
                if target else None)
    if head is not None:  # the drafter ↔ target rule table, as every command runs it
        fit = Target(str(target), head.hidden_size, runner.n_layers if runner else None, head.vocab_size)
        for side, path in (("reference", reference), ("candidate", candidate)):
            check_runtime_fit(models[side].spec, fit, f"{side} drafter {path}")
    if runner is not None:
        inputs = _hf_inputs(runner, head, models, prompt, prompt_ids)
    else:
        inputs = _random_inputs(head, models, rounds, block, seed)

    run = _run_rounds(models, inputs, rounds, block, torch.device(device))
    result = ParityResult(
        reference=models["reference"].load_info,  # type: ignore[arg-type]
        candidate=models["candidate"].load_info,  # type: ignore[arg-type]
        mode=mode,
        target=str(target) if target is not None else None,
        device=device,
        dtype=dtype,
        seed=seed,
        block_size=block,
        rounds=run.rounds,
        per_position=run.per_position,
        overall=run.overall,
        hidden_per_position=run.hidden_per_position,
        hidden_overall=run.hidden_overall,
        prompt_ids=inputs.tokens(inputs.first_start) if hf_target else None,
    )
    specs = {side: m.spec for side, m in models.items()}
    first = run.first
    # Nothing below runs a model: drop the weights (2 GB packed for a 4B-size pair) before the diff streams its own.
    del models, ref_model, head, inputs, run, runner  # (an HF target's model too)
    gc.collect()
    if weights:

        result.weights = diff_drafters(reference, candidate)
    if dump is not None:
        _write_dump(Path(dump), result, first, specs, force=force)
        result.dump = str(dump)
    return result


@dataclass
class _FirstRound:
    """The first round's exact tensors per side (for --dump)."""

    context: dict[str, torch.Tensor]
    blocks: dict[str, torch.Tensor]
    noises: dict[str, torch.Tensor]
    steps: dict[str, Any]
    positions: torch.Tensor


@dataclass
class _Run:
    rounds: list[RoundResult]
    per_position: list[tuple[int, LogitStats]]
    overall: LogitStats | None
    hidden_per_position: list[tuple[int, HiddenStats]]
    hidden_overall: HiddenStats
    first: _FirstRound


def _run_rounds(models: dict[str, DFlashDraftModel], inputs: _Inputs, rounds: int, block: int,
                device: torch.device) -> _Run:
    caches = {side: m.new_cache() for side, m in models.items()}
    head = inputs.head
    dtype = next(m.weight.dtype for m in models["reference"].modules() if isinstance(m, RMSNorm))  # the compute dtype
    start, prev = inputs.first_start, 0
    logit_rows: list[dict[str, np.ndarray]] = []
    hidden_rows: list[dict[str, np.ndarray]] = []
    rounds_out: list[RoundResult] = []
    first: _FirstRound | None = None
    for r in range(rounds):
        positions = torch.arange(prev, start + block, device=device)[None]
        steps, blocks, noises, contexts = {}, {}, {}, {}
        for side, m in models.items():
            ids = [inputs.tokens(start + 1)[start]] + [m.spec.mask_token_id or 0] * (block - 1)
            blocks[side] = torch.tensor([ids], device=device)
            if head is not None:
                noises[side] = m.noise_embedding(blocks[side], head)
            else:
                rows = torch.cat([inputs.noise[start : start + 1], inputs.noise[-1:].expand(block - 1, -1)])
                noises[side] = (rows[None] * m.embedding_scale).to(device=device, dtype=dtype)
            contexts[side] = inputs.feats[side](prev, start).to(device=device, dtype=dtype)
            steps[side] = m.draft(contexts[side], blocks[side], positions, caches[side], head,
                                  noise_embedding=noises[side])
        if first is None:
            first = _FirstRound(contexts, blocks, noises, steps, positions)

        ref, cand = steps["reference"], steps["candidate"]
        hidden_rows.append(_hidden_rows(ref.hidden[0].float().cpu(), cand.hidden[0].float().cpu()))
        ref_tokens = cand_tokens = None
        cand_acc = ref_acc = None
        if ref.logits is not None and cand.logits is not None:
            # a d2t drafter's own rows (finite; one row ↔ one target id) rather than the −inf-padded target vocab
            ref_l, cand_l = ((ref.draft_logits, cand.draft_logits) if ref.draft_logits is not None
                             and cand.draft_logits is not None and ref.draft_logits.shape == cand.draft_logits.shape
                             else (ref.logits, cand.logits))
            logit_rows.append(_logit_rows(ref_l[0].float().cpu(), cand_l[0].float().cpu()))
            ref_tokens, cand_tokens = ref.tokens[0].tolist(), cand.tokens[0].tolist()
            cand_acc = accepted_prefix(cand_tokens, ref_tokens)
        if inputs.has_truth and ref_tokens is not None:
            ref_acc = accepted_prefix(ref_tokens, inputs.tokens(start + block)[start + 1 :])
            produced = ref_acc + 1
        else:
            produced = block  # no target to verify: the reference's whole draft (+ a bonus token) is accepted
        rounds_out.append(RoundResult(r, start, start - prev, ref_tokens, cand_tokens, cand_acc, ref_acc, produced))
        prev, start = start, start + produced

    positions_logit: list[tuple[int, LogitStats]] = []
    overall = None
    if logit_rows:
        rows = {k: np.concatenate([lr[k] for lr in logit_rows]) for k in logit_rows[0]}
        first_slot = models["reference"].first_draft_slot  # 0 when slot 0 predicts (sample_from_anchor)
        pos = np.tile(np.arange(first_slot, block), len(logit_rows))
        positions_logit = [(p, _logit_stats(_select(rows, pos == p))) for p in range(first_slot, block)]
        overall = _logit_stats(rows)
    hrows = {k: np.concatenate([h[k] for h in hidden_rows]) for k in hidden_rows[0]}
    hpos = np.tile(np.arange(block), len(hidden_rows))
    assert first is not None
    return _Run(
        rounds=rounds_out,
        per_position=positions_logit,
        overall=overall,
        hidden_per_position=[(p, _hidden_stats(_select(hrows, hpos == p))) for p in range(block)],
        hidden_overall=_hidden_stats(hrows),
        first=first,
    )


# ---------------------------------------------------------------------------------------------
# Dump (format: docs/formats.md, "Parity dump")
# ---------------------------------------------------------------------------------------------


def _np(t: torch.Tensor, dtype: Any) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().cpu().numpy() if dtype == np.float32 else t.detach().cpu().numpy(),
                                dtype=dtype)


def _write_dump(path: Path, result: ParityResult, first: _FirstRound, specs: dict[str, Any], *,
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


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

_LOGIT_COLUMNS = [
    Column("position", "pos"), Column("n", "n"), Column("top1", "top-1", "pct"), Column("top5", "top-5 overlap", "pct"),
    Column("kl_mean", "KL mean", ".3g"), Column("kl_p99", "KL p99", ".3g"), Column("kl_max", "KL max", ".3g"),
    Column("max_abs", "max |Δlogit|", ".3g"), Column("rms", "RMS |Δlogit|", ".3g"),
]
_HIDDEN_COLUMNS = [
    Column("position", "pos"), Column("n", "n"), Column("rel_rms", "rel RMS", ".3g"), Column("max_abs", "max |Δ|", ".3g"),
    Column("cosine", "cosine", ".6f"),
]


def _form(info: LoadInfo) -> str:
    kind = "HF checkpoint" if info.kind == "hf" else f"GGUF ({info.dialect})"
    types = ", ".join(f"{n} {t}" for t, n in sorted(info.tensor_types.items()))
    return f"{info.path} — {kind}: {types}; {info.matmul}"


def _build_report(r: ParityResult, threshold_top1: float | None, threshold_kl: float | None) -> Report:
    failures = r.failures(threshold_top1, threshold_kl)
    o = r.overall
    if o is not None:
        headline = (f"top-1 {o.top1:.2%}, top-5 {o.top5:.2%}, KL mean {o.kl_mean:.3g}, accepted prefix "
                    f"{r.accepted_mean:.2f}/{r.block_size - 1} over {len(r.rounds)} round(s)")
    else:
        headline = (f"hidden-state rel RMS {r.hidden_overall.rel_rms:.3g}, cosine {r.hidden_overall.cosine:.6f} "
                    "(no target head: no logits)")
    status, level = verdict(failures, None, headline, "ok" if o is not None else "info")

    w = r.weights
    rel = w.rel_rms_summary() if w is not None else {}
    summary = [
        Field("reference", _form(r.reference), key="reference"),
        Field("candidate", _form(r.candidate), key="candidate"),
        Field("family", " / ".join(dict.fromkeys((r.reference.family_name, r.candidate.family_name))), key="family"),
        Field("verification", VERIFY_MODE, key="verification"),
        Field("inputs", MODES[r.mode], key="mode_text"),
        Field("mode", r.mode, key="mode"),
        Field("target", r.target, key="target"),
        Field("device / dtype", f"{r.device} / {r.dtype}", key="device_dtype"),
        Field("rounds", len(r.rounds), key="rounds"),
        Field("seed", r.seed, key="seed"),
    ]
    if o is not None:
        summary += [
            Field("top-1 agreement", o.top1, "pct", key="top1"),
            Field("top-5 overlap", o.top5, "pct", key="top5"),
            Field("KL(ref‖cand) mean / p99 / max", (o.kl_mean, o.kl_p99, o.kl_max), ".3g", key="kl"),
            Field("max / RMS |Δlogit|", (o.max_abs, o.rms), ".3g", key="dlogit"),
            Field("accepted prefix (mean)", r.accepted_mean, ".3g", key="accepted_prefix_mean"),
        ]
    summary += [
        Field("hidden rel RMS / cosine", (r.hidden_overall.rel_rms, r.hidden_overall.cosine), ".4g", key="hidden"),
        Field("weights rel RMS median / max", (rel.get("median"), rel.get("max")) if w is not None else None,
              ".4g", key="weights_rel_rms"),
        Field("thresholds top-1 / KL", (threshold_top1, threshold_kl), ".4g", key="thresholds"),
        Field("dump", r.dump, key="dump"),
        Field("exit code", EXIT_FAILED if failures else EXIT_OK, key="exit_code"),
    ]

    sections: list[Any] = [_weights_section(r)]
    if w is not None:
        sections.append(_worst_tensors(w))
    if o is not None:
        rows = [{"position": p, **s.to_dict()} for p, s in r.per_position]
        rows.append({"position": "all", **o.to_dict()})
        flagged = set()
        if threshold_top1 is not None:
            flagged |= {i for i, (_, s) in enumerate(r.per_position) if s.top1 < threshold_top1}
        if threshold_kl is not None:
            flagged |= {i for i, (_, s) in enumerate(r.per_position) if s.kl_mean > threshold_kl}
        sections.append(Table("Logit parity per block position", _LOGIT_COLUMNS, rows, id="logits", flagged=flagged,
                              level="error" if failures else "info",
                              note="block position 1 is the first drafted token; KL in nats, reference as truth"))
    hrows = [{"position": p, **s.to_dict()} for p, s in r.hidden_per_position]
    hrows.append({"position": "all", **r.hidden_overall.to_dict()})
    sections.append(Table("Output hidden-state parity per block position", _HIDDEN_COLUMNS, hrows, id="hidden",
                          note="the drafters' final-norm output; position 0 is the anchor"))
    sections.append(Table(
        "Rounds",
        [Column("round", "round"), Column("start", "anchor pos"), Column("context", "new context"),
         Column("candidate_accepted", "cand prefix = ref draft"), Column("reference_accepted", "ref accepted by target"),
         Column("produced", "advanced by")],
        [{"round": x.index, "start": x.start, "context": x.context, "candidate_accepted": x.candidate_accepted,
          "reference_accepted": x.reference_accepted, "produced": x.produced,
          "reference_tokens": x.reference_tokens, "candidate_tokens": x.candidate_tokens} for x in r.rounds],
        id="rounds",
        note="each round drafts from the cache of the previous ones, cropped to the context as dflash_generate does",
    ))
    notes = [MODES[r.mode]] + [f"reference: {n}" for n in r.reference.notes] + [f"candidate: {n}" for n in r.candidate.notes]
    sections.append(Notes("Notes", notes, id="notes"))
    title = f"dflash-parity: {Path(r.reference.path).name} vs {Path(r.candidate.path).name}"
    return Report(title, status, level, summary, sections)


def _weights_section(r: ParityResult) -> Table:
    w = r.weights
    columns = [Column("item", "weights"), Column("value", "value", ".4g")]
    if w is None:
        return Table("Weight parity", columns, [], empty="skipped", id="weights")
    rel = w.rel_rms_summary()
    worst = w.tensors[0].canonical if w.tensors else None
    failures = w.failures()
    rows = [
        {"item": "tensors compared", "value": len(w.tensors)},
        {"item": "identical tensors", "value": sum(t.stats.identical for t in w.tensors)},
        {"item": "rel RMS median", "value": rel["median"]},
        {"item": "rel RMS mean", "value": rel["mean"]},
        {"item": "rel RMS max", "value": rel["max"]},
        {"item": "worst tensor", "value": worst},
        {"item": "bits per weight ref / cand", "value": (w.bits_per_weight("A"), w.bits_per_weight("B"))},
        {"item": "diff verdict", "value": "; ".join(failures) if failures else "no missing tensors, same meaning"},
    ]
    for d in w.meaning_differences:
        rows.append({"item": f"meaning differs: {d.field}", "value": f"{d.a} vs {d.b}"})
    return Table("Weight parity", columns, rows, id="weights", level="warning" if failures else "info",
                 note="the dflash-diff comparison, summarised (rel RMS = ‖ref−cand‖/‖ref‖ per tensor)")


def _worst_tensors(w: Any, n: int = 8) -> Table:
    rows = [{"tensor": t.canonical, "type_a": t.a.type_name, "type_b": t.b.type_name, "rel_rms": t.rel_rms,
             "cosine": t.stats.cosine} for t in w.tensors[:n]]
    return Table("Worst tensors", [Column("tensor", "tensor"), Column("type_a", "ref type"),
                                   Column("type_b", "cand type"), Column("rel_rms", "rel RMS", ".4g"),
                                   Column("cosine", "cosine", ".6f")], rows, id="worst_tensors")
