"""`dflash-parity`: does the candidate file still draft the same tokens as the reference?

Both drafters (HF dirs or GGUFs of any dialect/type) run in the runtime on identical inputs, round after round
with their own KV caches cropped as in ``dflash_generate``, and their outputs are compared: weight parity (the Diff
report, summarised), then logit parity per block position — top-1 agreement, top-5 overlap, KL(ref‖cand), |Δlogit|
— and the accepted-prefix length the candidate's greedy draft would get if the reference's draft were the truth.

Where the inputs come from:

- ``target`` an HF directory: the target runs with transformers on the prompt; the token stream is the prompt plus
  the target's greedy continuation (what greedy speculative decoding outputs), each drafter gets the tap features
  of *its own* ``target_layer_ids`` and rounds advance by what the target accepts of the reference's draft;
- ``target`` a GGUF: its ``token_embd`` / ``output`` give embeddings and lm_head, the context hidden states are
  seeded random, and each round accepts the reference's whole draft;
- no target: hidden states and embeddings are seeded random and only the drafters' output hidden states are
  compared — logits need a target head.

The drafters run one after the other (the reference through every round, then the candidate on the same inputs),
so one drafter's weights are resident at a time (a 4B-size pair: 1.0 GB of bf16, not 1.6 GB with the Q8_0 beside
it). With a GGUF target the vocabulary projection waits until both have drafted: the head is read through a map of
its file and applied once to every round of both (`Linear.forward_many`: each call as alone, the same floats); an
HF target's rounds need the reference's tokens as they go (the target accepts what matches them). A chain drafter
(EAGLE-3) picks each token before it drafts the next, so it drafts with the head whatever the target. This module
is the run (`_Inputs`, `run_parity`); the ``--dump`` file is `parity.dump`, the figures `parity.stats`, the report
`parity.result`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..diff import diff_drafters
from ..errors import DFlashError, UsageError
from ..families import family_for_spec
from ..spec import DrafterSpec
from ..files import check_output
from .dump import FirstRound, write_dump
from .result import ParityResult, RoundResult
from .stats import (HiddenStats, LogitStats, accepted_prefix, hidden_rows, hidden_stats, logit_rows,
                    logit_stats, select_rows)
from ..target_rules import Target, check_runtime_fit
from ..runtime import DFlashDraftModel, HFTarget, LoadInfo, TargetHead, load_drafter, load_target_head
from ..runtime.dflash import DraftStep, RMSNorm
from ..runtime.speculative import context_ids_kwargs
from ..runtime.linear import Linear
from ..runtime.config import first_draft_slot
from ..runtime.load import runtime_spec
from ..causality import causality_differs
from ..divergences import divergence_causes, hf_config
from ..runtime.zoo import model_class_for
from ..runtime.target import DEFAULT_PROMPT, GreedyStream


CONTEXT_LEN = 32  # context positions of the first round when the hidden states are random


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


def _hf_inputs(target: HFTarget, head: TargetHead, specs: dict[str, DrafterSpec], prompt: str | None,
               prompt_ids: Sequence[int] | None) -> _Inputs:
    ids = list(prompt_ids) if prompt_ids is not None else target.encode(prompt or DEFAULT_PROMPT)
    if not ids:
        raise UsageError("the prompt is empty — give --prompt text or --prompt-ids")
    vocab = int(target.model.config.get_text_config().vocab_size)
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise UsageError(f"--prompt-ids: id {bad[0]} is outside the target vocabulary (0..{vocab - 1})")
    stream = target.stream(ids, {i for spec in specs.values() for i in spec.target_layer_ids})
    # Each drafter reads the layers *it* was trained on: a file with shifted taps shows up here.
    feats = {side: functools.partial(stream.features, spec.target_layer_ids) for side, spec in specs.items()}
    return _Inputs(head, len(ids), stream=stream, feats=feats)


def _random_inputs(head: TargetHead | None, specs: dict[str, DrafterSpec], rounds: int, block: int,
                   seed: int, context_len: int = CONTEXT_LEN) -> _Inputs:
    g = torch.Generator().manual_seed(seed)
    ref = specs["reference"]
    length = context_len + rounds * block + 1
    # Target hidden states are O(1)–O(10) per channel; fc + hidden_norm make the scale immaterial.
    table = torch.randn(1, length, ref.fc_input_width, generator=g)
    vocab = head.vocab_size if head is not None else (ref.vocab_size or 1)
    tokens = torch.randint(0, vocab, (length,), generator=g).tolist()
    noise = None
    if head is None:  # one row per anchor, and the mask row (the same for every mask position)
        noise = torch.randn(length + 1, ref.hidden_size, generator=g) * 0.05

    def feats(start: int, end: int) -> torch.Tensor:
        return table[:, start:end]

    return _Inputs(head, context_len, tokens=tokens, feats={"reference": feats, "candidate": feats}, noise=noise)


def _check_pair(a: DrafterSpec, b: DrafterSpec, mode: str) -> None:
    for name, what in (("hidden_size", "hidden size"), ("block_size", "block size")):
        if getattr(a, name) != getattr(b, name):
            raise DFlashError(f"the drafters differ in {what} ({getattr(a, name)} vs {getattr(b, name)}): "
                              "they cannot run on the same inputs")
    if mode != "hf-target" and a.n_taps != b.n_taps:
        raise DFlashError(f"the drafters tap {a.n_taps} vs {b.n_taps} target layers: random hidden states cannot "
                          "feed both — pass --target HF_DIR so each gets its own taps")
    if mode != "no-target":
        for side, s in (("reference", a), ("candidate", b)):
            if s.mask_token_id is None and family_for_spec(s).uses_mask_token:
                raise DFlashError(f"the {side} drafter has no mask_token_id, so its block cannot be embedded")


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def run_parity(
    reference: str | os.PathLike,
    candidate: str | os.PathLike,
    *,
    target: str | os.PathLike | HFTarget | None = None,
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
    context_len: int = CONTEXT_LEN,
    ggml_activations: bool = True,
) -> ParityResult:
    """Run both drafters on the same inputs for ``rounds`` draft rounds and compare them. ``target``: an HF
    directory (or that target already loaded), a GGUF, or None; ``context_len``: the random context's positions
    where there is no HF target (`dflashkit.parity.sweep` sets it per ``--context`` level); ``ggml_activations``:
    a llama.cpp GGUF multiplies with activations rounded as ggml does (False: float32, its weights' error only)."""
    if rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {rounds}")
    if prompt is not None and prompt_ids is not None:
        raise UsageError("give --prompt or --prompt-ids, not both")
    hf_target = isinstance(target, HFTarget) or (target is not None and Path(target).is_dir())
    if (prompt is not None or prompt_ids is not None) and not hf_target:
        raise UsageError("--prompt / --prompt-ids need --target as an HF model directory (a GGUF target only lends "
                         "its embeddings and lm_head; without a target the hidden states are random)")
    if dump is not None:
        dump = Path(dump)
        # checked now, not after a long run; the dump must never replace a file parity reads
        dump = check_output(dump, inputs=[reference, candidate, getattr(target, "path", target)], force=force,
                            label="--dump")

    paths = {"reference": reference, "candidate": candidate}
    # both drafters' specs and every check of them before either loads (their weights load one at a time)
    specs = {side: runtime_spec(path) for side, path in paths.items()}
    for spec in specs.values():
        model_class_for(spec)  # the runtime block it runs in exists (nothing is built: a spec is all the checks read)
    block = specs["reference"].block_size
    causes = causality_differs(specs["reference"], specs["candidate"]) + divergence_causes(
        specs["reference"], specs["candidate"], hf_config(reference))
    slots = first_draft_slot(specs["reference"]), first_draft_slot(specs["candidate"])
    if slots[0] != slots[1] and not any(c.startswith("sample_from_anchor") for c in causes):
        causes.append(f"the drafters predict from different block slots (reference from slot {slots[0]}, candidate "
                      f"from slot {slots[1]}): draft token j is compared with draft token j")
    mode = "hf-target" if hf_target else "gguf-target" if target is not None else "no-target"
    _check_pair(specs["reference"], specs["candidate"], mode)

    def load(path: str | os.PathLike) -> DFlashDraftModel:
        # packed: weights stay in their file type (unpacked per matmul, same float32 values): a few GB less
        return load_drafter(path, device=device, dtype=dtype, keep_quantized=keep_quantized, packed=True,
                            ggml_activations=ggml_activations)

    runner: HFTarget | None = None
    if hf_target:
        runner = target if isinstance(target, HFTarget) else HFTarget(target, device=device)  # type: ignore[arg-type]
        head: TargetHead | None = runner.head(dtype=dtype)
    else:
        head = (load_target_head(target, device=device, dtype=dtype, keep_quantized=keep_quantized, packed=True,
                                 mapped=True) if target else None)
    if head is not None:  # the drafter ↔ target rule table, as every command runs it
        fit = Target(str(getattr(target, "path", target)), head.hidden_size, runner.n_layers if runner else None, head.vocab_size)
        for side, path in paths.items():
            check_runtime_fit(specs[side], fit, f"{side} drafter {path}")
    if runner is not None:
        inputs = _hf_inputs(runner, head, specs, prompt, prompt_ids)
    else:
        inputs = _random_inputs(head, specs, rounds, block, seed, context_len)

    run = _run_rounds(paths, load, inputs, rounds, block, torch.device(device))
    result = ParityResult(
        reference=run.infos["reference"],  # type: ignore[arg-type]
        candidate=run.infos["candidate"],  # type: ignore[arg-type]
        mode=mode,
        target=str(getattr(target, "path", target)) if target is not None else None,
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
        causes=causes,
    )
    first = run.first
    # Nothing below runs a model: drop what is left (the head, an HF target's model) before the diff streams its own.
    del head, inputs, run, runner
    gc.collect()
    if weights:

        result.weights = diff_drafters(reference, candidate)
    if dump is not None:
        write_dump(Path(dump), result, first, specs, force=force)
        result.dump = str(dump)
    return result


@dataclass
class _Run:
    rounds: list[RoundResult]
    per_position: list[tuple[int, LogitStats]]
    overall: LogitStats | None
    hidden_per_position: list[tuple[int, HiddenStats]]
    hidden_overall: HiddenStats
    first: FirstRound
    infos: dict[str, LoadInfo]


class _Projected(torch.nn.Module):
    """The target head, its projection of known hidden states already computed (`TargetHead.forward_many`): a
    drafter's ``head_step`` asks it for exactly those tensors; anything else goes to the head itself."""

    def __init__(self, head: TargetHead, done: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.head, self.done = head, done

    @property
    def vocab_size(self) -> int:
        return self.head.vocab_size

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.embed(ids)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        got = self.done.get(id(hidden))
        return got if got is not None else self.head(hidden)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one intra-op thread for a drafter's round: small matmuls alternating with unpacking, where more
    threads spin (a 4B-size pair: 8.0 → 6.5 s of CPU, the same wall time) — and one thread keeps every float of the
    run the same whatever the machine's core count. An HF target's own forwards keep their threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _drop_backbone(m: DFlashDraftModel) -> None:
    """Free a drafter's decoder layers and ``fc`` (nearly all of its weights) once it has drafted every round; what
    its ``head_step`` reads (an own head, ``d2t``, DSpark's heads) stays."""
    for part in (m.fc, m.layers):
        for lin in part.modules():
            if isinstance(lin, Linear):
                lin.weight = lin.qdata = None


def _draft_side(m: DFlashDraftModel, side: str, inputs: _Inputs, schedule: list[tuple[int, int, int | None]],
                rounds: int, block: int, device: torch.device, head: TargetHead | None
                ) -> tuple[list[DraftStep], list[torch.Tensor], dict[str, Any]]:
    """Every round of one drafter: its steps, each round's anchor (the block's first id, where a head step starts)
    and the first round's inputs. The reference fills ``schedule`` (each round's context start, block start and
    the prefix of its draft the target accepts, None without a target's tokens: the next block starts past it);
    the candidate runs the same schedule. ``head`` None: hidden
    states only (the logits come later, `_project`)."""
    cache = m.new_cache()
    dtype = next(x.weight.dtype for x in m.modules() if isinstance(x, RMSNorm))  # the compute dtype
    steps: list[DraftStep] = []
    anchors: list[torch.Tensor] = []
    first: dict[str, Any] = {}
    prev, start = 0, inputs.first_start
    for r in range(rounds):
        if side == "candidate":
            prev, start, _ = schedule[r]
        positions = torch.arange(prev, start + block, device=device)[None]
        blocks = torch.tensor([[inputs.tokens(start + 1)[start]] + [m.spec.mask_token_id or 0] * (block - 1)],
                              device=device)
        if inputs.head is not None:
            noise = m.noise_embedding(blocks, inputs.head)
        else:
            rows = torch.cat([inputs.noise[start : start + 1], inputs.noise[-1:].expand(block - 1, -1)])
            noise = (rows[None] * m.embedding_scale).to(device=device, dtype=dtype)
        context = inputs.feats[side](prev, start).to(device=device, dtype=dtype)
        following = context_ids_kwargs(m, inputs.tokens(start + 1)[prev + 1 : start + 1], device)  # a chain's tokens
        with _one_thread():
            step = m.draft(context, blocks, positions, cache, head, noise_embedding=noise, **following)
        steps.append(step)
        anchors.append(blocks[:, 0])
        if r == 0:
            first = {"context": context, "blocks": blocks, "noise": noise, "positions": positions}
        if side == "reference":
            accepted = (accepted_prefix(step.tokens[0].tolist(), inputs.tokens(start + block)[start + 1 :])
                        if inputs.has_truth and step.tokens is not None else None)
            schedule.append((prev, start, accepted))
            # no target to verify: the reference's whole draft (+ a bonus token) is accepted
            prev, start = start, start + (block if accepted is None else accepted + 1)
    return steps, anchors, first


def _project(models: dict[str, DFlashDraftModel], steps: dict[str, list[DraftStep]],
             anchors: dict[str, list[torch.Tensor]], head: TargetHead) -> None:
    """Every round's logits and tokens, both drafters, the head applied once over all of them (`_Projected`)."""
    wanted = [(side, r, s.hidden[:, models[side].first_draft_slot :, :]) for side in steps
              for r, s in enumerate(steps[side]) if s.logits is None]  # a chain drafter drafted with the head
    own = {side for side, m in models.items() if m.lm_head is not None}  # a drafter's own head: its own matmul
    asks = [x for side, _, x in wanted if side not in own]
    with _one_thread():
        done = dict(zip(map(id, asks), head.forward_many(asks))) if asks else {}
        projected = _Projected(head, done)
        for side, r, draft_hidden in wanted:
            steps[side][r] = models[side].head_step(steps[side][r].hidden, draft_hidden, anchors[side][r], projected,
                                                    0.0)
    head.release()


def _run_rounds(paths: dict[str, Any], load: Callable[[Any], DFlashDraftModel], inputs: _Inputs, rounds: int,
                block: int, device: torch.device) -> _Run:
    head = inputs.head
    # An HF target's rounds follow the reference's tokens as they come: logits in each round. Otherwise the head
    # waits until both drafters have drafted, and runs once over all their rounds.
    defer = head is not None and not inputs.has_truth
    schedule: list[tuple[int, int, int | None]] = []
    steps: dict[str, list[DraftStep]] = {}
    firsts: dict[str, dict[str, Any]] = {}
    anchors: dict[str, list[torch.Tensor]] = {}
    models: dict[str, DFlashDraftModel] = {}
    infos: dict[str, LoadInfo] = {}
    for side in ("reference", "candidate"):
        m = load(paths[side])
        infos[side] = m.load_info  # type: ignore[attr-defined]
        steps[side], anchors[side], firsts[side] = _draft_side(
            m, side, inputs, schedule, rounds, block, device, None if defer and not m.reads_context_ids else head)
        _drop_backbone(m)  # one drafter's weights at a time
        models[side] = m
        gc.collect()
    if defer:
        assert head is not None
        _project(models, steps, anchors, head)
    first = FirstRound({k: f["context"] for k, f in firsts.items()}, {k: f["blocks"] for k, f in firsts.items()},
                       {k: f["noise"] for k, f in firsts.items()}, {k: v[0] for k, v in steps.items()},
                       firsts["reference"]["positions"])

    logit_rounds: list[dict[str, np.ndarray]] = []
    hidden_rounds: list[dict[str, np.ndarray]] = []
    rounds_out: list[RoundResult] = []
    for r, (ref, cand) in enumerate(zip(steps["reference"], steps["candidate"])):
        prev, start, ref_acc = schedule[r]  # what the target accepted of the reference's draft, found as it ran
        hidden_rounds.append(hidden_rows(ref.hidden[0].float().cpu(), cand.hidden[0].float().cpu()))
        ref_tokens = cand_tokens = None
        cand_acc = None
        if ref.logits is not None and cand.logits is not None:
            # a d2t drafter's own rows (finite; one row ↔ one target id) rather than the −inf-padded target vocab
            ref_l, cand_l = ((ref.draft_logits, cand.draft_logits) if ref.draft_logits is not None
                             and cand.draft_logits is not None and ref.draft_logits.shape[-1] == cand.draft_logits.shape[-1]
                             else (ref.logits, cand.logits))
            # draft token j against draft token j: drafters that predict from different block slots (one reads
            # slot 0, sample_from_anchor) are compared over the draft tokens both make
            n = min(ref_l.shape[1], cand_l.shape[1])
            logit_rounds.append(logit_rows(ref_l[0, :n].float().cpu(), cand_l[0, :n].float().cpu()))
            ref_tokens, cand_tokens = ref.tokens[0].tolist()[:n], cand.tokens[0].tolist()[:n]
            cand_acc = accepted_prefix(cand_tokens, ref_tokens)
        produced = block if ref_acc is None else ref_acc + 1
        rounds_out.append(RoundResult(r, start, start - prev, ref_tokens, cand_tokens, cand_acc, ref_acc, produced))

    positions_logit: list[tuple[int, LogitStats]] = []
    overall = None
    if logit_rounds:
        rows = {k: np.concatenate([lr[k] for lr in logit_rounds]) for k in logit_rounds[0]}
        first_slot = models["reference"].first_draft_slot  # 0 when slot 0 predicts (sample_from_anchor)
        per_round = len(next(iter(logit_rounds[0].values())))
        pos = np.tile(np.arange(first_slot, first_slot + per_round), len(logit_rounds))
        positions_logit = [(p, logit_stats(select_rows(rows, pos == p)))
                           for p in range(first_slot, first_slot + per_round)]
        overall = logit_stats(rows)
    hrows = {k: np.concatenate([h[k] for h in hidden_rounds]) for k in hidden_rounds[0]}
    hpos = np.tile(np.arange(block), len(hidden_rounds))
    return _Run(
        rounds=rounds_out,
        per_position=positions_logit,
        overall=overall,
        hidden_per_position=[(p, hidden_stats(select_rows(hrows, hpos == p))) for p in range(block)],
        hidden_overall=hidden_stats(hrows),
        first=first,
        infos=infos,
    )
