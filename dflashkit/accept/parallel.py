"""``--parallel N[,N…]``: a drafter under N concurrent requests — what a server operator decides by.

Per level N: the target alone and the target with the drafter, each a llama-server started with ``-np N`` (its
context N times one request's), asked the prompts in *batches* of N requests sent at once (prompt ``b·N + k`` of
batch b, wrapping around the set so every batch is full). Per level:

* every request's output against the target alone's output for the same prompt at the same level (greedy: a
  drafter never changes what is generated — any difference is named, request by request);
* τ per slot (the reply's ``id_slot``): a slot that drafts nothing, or whose accepted tokens per round are under
  half of slot 0's, is named — the forks' bug of drafting every slot from slot 0's state (beellama #24, buun #110).
  The server picks which prompts a slot gets, and τ differs by prompt: each slot's accepted tokens per round are
  counted against what the same prompts accept one request at a time (the one-at-a-time measurement of the same
  build), where that was measured;
* aggregate tok/s with and without the drafter (the batch's generated tokens over its wall time, from the first
  request sent to the last reply), and the speed-up: the geometric mean over batches of the paired ratio, with its
  bootstrap CI over batches and the verdict of `measured_verdict` (gain / no gain / loss).

A server that dies during a level (killed, or aborting by itself at a large ``-np``) makes the level *crashed*, with
its signal and last lines; one that refuses to run it, or replies what no request allows (an ``id_slot`` that is no
slot of its ``-np``), makes it *refused*. Either way the level has no figure (`figures`: None), never a NaN.

The order of the two arms alternates batch by batch, as the one-request measurement does.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import DFlashError
from ..llama_cpp.process import LlamaCppCrashed
from ..llama_cpp.server import Completion, LlamaServer
from ..llama_cpp.speculative_simple import mean_tau
from .serving_measure import VERDICT_CRASHED, VERDICT_DIFFERS, PairedSpeeds, first_difference, measured_verdict

#: a slot drafts "much less" than slot 0 when its accepted tokens per round are under this share of slot 0's —
#: each counted against the same prompts served one at a time where those are known, since which prompts a slot gets
#: is the server's choice and τ differs by prompt far more than by slot
SLOT_SHARE = 0.5
#: the verdict of a level whose server refused to run it or replied what no request allows (a crash: VERDICT_CRASHED)
VERDICT_REFUSED = "refused"


@dataclass
class Batch:
    prompts: list[int]  # prompt index of each request
    wall_s: float
    replies: list[Completion]

    @property
    def tokens_per_s(self) -> float:
        decoded = sum(c.decoded for c in self.replies)
        return decoded / self.wall_s if self.wall_s > 0 else math.nan


@dataclass
class ParallelLevel(PairedSpeeds):
    """One drafter at ``-np n``: ``on[b]`` / ``off[b]`` ↔ batch b (with the drafter / the target alone)."""

    drafter: str
    n: int
    on: list[Batch] = field(default_factory=list)
    off: list[Batch] = field(default_factory=list)
    refused: str | None = None  # why the level has no figure: the server's refusal, or its crash (``crashed``)
    crashed: bool = False  # the server died by a signal: ``refused`` is "… crashed (SIGNAL) while …: last lines"
    seed: int = 0
    alone_taus: list[float] = field(default_factory=list)  # prompt i's τ one request at a time (same build, -np 1)

    def aggregate(self, batches: list[Batch]) -> float | None:
        """All batches' generated tokens over their wall time; None without a batch (a level with no figure)."""
        decoded = sum(c.decoded for b in batches for c in b.replies)
        wall = sum(b.wall_s for b in batches)
        return decoded / wall if wall > 0 else None

    @property
    def measured(self) -> bool:
        """The level has figures: the server ran every batch of both arms."""
        return self.refused is None and bool(self.on) and bool(self.off)

    def differences(self, prompt_names: Sequence[str]) -> list[str]:
        """Requests whose output is not the target alone's for the same prompt (first differing token named)."""
        alone: dict[int, list[int]] = {}
        for b in self.off:
            for i, c in zip(b.prompts, b.replies):
                alone.setdefault(i, c.tokens)
        out = []
        for n, b in enumerate(self.on):
            for i, c in zip(b.prompts, b.replies):
                ref = alone.get(i)
                if ref is not None and ref != c.tokens:
                    at = first_difference(ref, c.tokens)
                    out.append(f"batch {n + 1}, prompt {prompt_names[i]} (slot {c.slot}): differs from the target "
                               f"alone at token {at}")
        return out

    def slot_taus(self) -> dict[int, float]:
        return {s: mean_tau([t for _, t in r]) for s, r in self._slot_requests().items()}

    def _slot_requests(self) -> dict[int, list[tuple[int, float]]]:
        slots: dict[int, list[tuple[int, float]]] = {}
        for b in self.on:
            for i, c in zip(b.prompts, b.replies):
                if c.slot is not None and c.tau_known:
                    slots.setdefault(c.slot, []).append((i, c.tau))
        return dict(sorted(slots.items()))

    def _alone(self, requests: list[tuple[int, float]]) -> float:
        """τ of the same prompts one request at a time (NaN where one of them has no such τ: the two means would
        cover different prompts)."""
        known = [self.alone_taus[i] for i, _ in requests if i < len(self.alone_taus)]
        if len(known) != len(requests) or not all(math.isfinite(t) for t in known):
            return math.nan
        return mean_tau(known)

    def silent_slots(self) -> list[int]:
        """The slots of ``-np n`` no reply with a τ came from: nothing is known of how they draft."""
        if not self.measured:
            return []
        return [s for s in range(self.n) if s not in self._slot_requests()]

    def slot_findings(self) -> list[str]:
        requests = self._slot_requests()
        taus = {s: mean_tau([t for _, t in r]) for s, r in requests.items()}
        first = taus.get(0)
        out = []
        if silent := self.silent_slots():
            replied = ", ".join(map(str, requests)) or "none"
            out.append(f"slot(s) {', '.join(map(str, silent))} of -np {self.n} answered no request with a τ (slots "
                       f"that did: {replied}): whether every slot drafts like slot 0 is not known")
        for s, tau in taus.items():
            if s == 0 or first is None or not first > 1.0:  # slot 0 drafting nothing too: the drafter, not a slot
                continue
            if not tau > 1.0:
                out.append(f"slot {s} drafts nothing that is accepted (τ {tau:.2f}; slot 0 τ {first:.2f}) — a server "
                           "that drafts slots past 0 from slot 0's state (the forks' bug)")
                continue
            alone_s, alone_0 = self._alone(requests[s]), self._alone(requests[0])
            if alone_s > 1.0 and alone_0 > 1.0:  # each slot's accepted share of what its prompts accept alone
                if (tau - 1.0) / (alone_s - 1.0) < SLOT_SHARE * (first - 1.0) / (alone_0 - 1.0):
                    out.append(f"slot {s} drafts much less than slot 0 (τ {tau:.2f} against {first:.2f}; the same "
                               f"prompts one at a time: τ {alone_s:.2f} and {alone_0:.2f})")
            elif (tau - 1.0) < SLOT_SHARE * (first - 1.0):
                out.append(f"slot {s} drafts much less than slot 0 (τ {tau:.2f} against {first:.2f})")
        return out

    def verdict(self, prompt_names: Sequence[str]) -> str:
        if self.refused is not None:
            return VERDICT_CRASHED if self.crashed else VERDICT_REFUSED
        if self.differences(prompt_names):
            return VERDICT_DIFFERS
        return measured_verdict(self.speedup, self.speedup_ci)


def batches_of(n_prompts: int, n: int) -> list[list[int]]:
    """Prompt indices in full batches of ``n`` (wrapping around the set)."""
    count = max(1, math.ceil(n_prompts / n))
    return [[(b * n + k) % n_prompts for k in range(n)] for b in range(count)]


def send_batch(server: Any, texts: Sequence[str], prompts: list[int], n_predict: int, seed: int,
               ignore_eos: bool) -> Batch:
    """Every request of a batch at once (one thread each); wall time from the first sent to the last answered."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        start = time.perf_counter()
        futures = [pool.submit(server.complete, texts[i], n_predict, seed=seed + i, ignore_eos=ignore_eos)
                   for i in prompts]
        replies = [f.result() for f in futures]
        wall = time.perf_counter() - start
    return Batch(list(prompts), wall, replies)


def measure_parallel(llama_server: str | os.PathLike, target_gguf: str | os.PathLike,
                     drafter: tuple[str, str | os.PathLike, int], texts: Sequence[str], levels: Sequence[int], *,
                     max_new_tokens: int, ctx_per_request: int, threads: int, extra_args: Sequence[str],
                     timeout: float, vocab: int | None, seed: int, ignore_eos: bool,
                     progress: Callable[[str], None], alone_taus: Sequence[float] = ()) -> list[ParallelLevel]:
    """Every level of ``levels`` for one drafter (path as given, GGUF, block size): module doc. ``alone_taus``:
    each prompt's τ one request at a time through the same build, what each slot's τ is counted against."""
    path, gguf, block = drafter
    out = []
    for n in levels:
        level = ParallelLevel(path, n, seed=seed, alone_taus=list(alone_taus))
        out.append(level)

        def server(with_drafter: bool) -> LlamaServer:
            return LlamaServer(llama_server, target_gguf, gguf if with_drafter else None,
                               draft_max=block - 1 if with_drafter else None, ctx_size=n * ctx_per_request,
                               threads=threads, extra_args=extra_args, startup_timeout=timeout,
                               request_timeout=timeout, vocab=vocab, parallel=n)

        progress(f"llama-server -np {n}: {Path(path).name} and the target alone, {n} concurrent requests a batch")
        try:
            with server(False) as base, server(True) as spec:
                for s in (spec, base):  # warm-up: every slot once
                    send_batch(s, texts, [k % len(texts) for k in range(n)], min(4, max_new_tokens), seed, ignore_eos)
                for b, prompts in enumerate(batches_of(len(texts), n)):
                    arms = [(spec, level.on), (base, level.off)]
                    for s, into in arms if b % 2 else arms[::-1]:
                        into.append(send_batch(s, texts, prompts, max_new_tokens, seed, ignore_eos))
                    progress(f"llama-server -np {n}: batch {b + 1}: {level.on[-1].tokens_per_s:.1f} tok/s with the "
                             f"drafter, {level.off[-1].tokens_per_s:.1f} alone")
        except DFlashError as exc:  # a server that refuses or dies is a finding of this level: no figure
            level.refused, level.crashed = str(exc), isinstance(exc, LlamaCppCrashed)
            level.on, level.off = [], []
            progress(f"llama-server -np {n}: {exc}")
    return out
