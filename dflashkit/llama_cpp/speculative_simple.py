"""τ inside llama.cpp: the same prompts through ``llama-speculative-simple``, its counts read back.

llama.cpp's ``examples/speculative-simple`` runs greedy draft–verify rounds with a target GGUF and a drafter GGUF
(``--spec-type draft-dflash``) and prints, at exit, ``n_predict`` (tokens committed), ``n_drafted`` and
``n_accept`` (draft tokens proposed and accepted). Each round commits accepted + 1 tokens for one target
forward, so over one prompt ``rounds = n_predict − n_accept`` and ``τ = n_predict / rounds`` — the same quantity
as the reference runtime's per-prompt τ (committed tokens per target verify forward).

With ``--verbose`` it also logs ``accepted A/D draft tokens`` per round; where those lines are complete they
give the per-round counts (histogram, acceptance per block position), else only the totals are used.

Its logger writes from a worker thread and is never flushed at exit (``common/log.cpp``: "this design may cause
logs to be lost"), so on a busy machine a run that exits 0 can lose its last lines — the counts among them. A
run without them is run again (at most ``RETRIES`` times); a count is never guessed.

"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import DFlashError
from .process import (NO_REPACK_NOTE, LlamaCppCrashed, check_extra_args, crash_message, executable, last_lines,
                      repacking_crash, run_bounded, spec_type_of)

SPECULATIVE_BINARY = "llama-speculative-simple"
RETRIES = 5
TIMEOUT_S = 600
# "0.00.231.592 I n_predict = 33": a timestamp and a level letter before the name when stderr is not a terminal
# [ \t], not \s: \s crosses newlines, and 300,000 blank lines made the search quadratic (minutes); at most 18 digits
_COUNT = re.compile(r"^(?:[\d.]+ [A-Z] )?[ \t]*(n_predict|n_drafted|n_accept)[ \t]*=[ \t]*(-?\d{1,18})[ \t]*$", re.M)
_ENCODED = re.compile(r"encoded\s+(\d+) tokens")
_ROUND = re.compile(r"accepted (\d+)/(\d+) draft tokens")
#: errors after which llama-speculative-simple leaves its loop and still exits 0 with the counts so far
_CUT_SHORT = ("failed to process speculative batch", "failed to process speculative prompt")
#: argv carries the prompt: no NUL byte, and well under the kernel's 128 KiB per-argument limit
MAX_PROMPT_BYTES = 100_000


def check_prompt_text(text: str) -> None:
    """A prompt llama-speculative-simple can be given on its command line, or a one-line error."""
    if "\x00" in text:
        raise DFlashError("a prompt holds a NUL character: llama-speculative-simple takes the prompt on its command "
                          "line, which cannot carry one — drop it from the prompt, or run without --llama-cpp")
    if len(text.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise DFlashError(f"a prompt is over {MAX_PROMPT_BYTES} bytes: llama-speculative-simple takes it on its command "
                          "line (128 KiB per argument at most) — shorten it, or run without --llama-cpp")


def mean_tau(taus: Sequence[float]) -> float:
    """A drafter's τ: the mean over prompts of per-prompt τ, prompts without a round (nan) left out — in both
    runtimes alike."""
    finite = [x for x in taus if math.isfinite(x)]
    return float(np.mean(finite)) if finite else math.nan


class CountedRounds:
    """``rounds`` and ``τ`` of one run from what it committed and how many draft tokens were accepted
    (`committed_accepted`): every target forward commits its accepted draft tokens + 1."""

    #: False where the counts are not a measurement of τ (a reply that ended inside a draft: `server.Completion`)
    tau_known: bool = True

    def committed_accepted(self) -> tuple[int, int]:
        raise NotImplementedError

    def drafted_accepted(self) -> tuple[int, int]:
        """Draft tokens proposed and accepted."""
        raise NotImplementedError

    @property
    def rounds(self) -> int:
        committed, accepted = self.committed_accepted()
        return committed - accepted

    @property
    def tau(self) -> float:
        """Tokens committed per target forward (NaN without a forward, or where it is not known)."""
        if not self.tau_known:
            return math.nan
        return self.committed_accepted()[0] / self.rounds if self.rounds > 0 else math.nan


@dataclass
class LlamaCppPromptRun(CountedRounds):
    """One prompt through llama-speculative-simple."""

    n_predict: int  # tokens committed
    n_drafted: int  # draft tokens proposed (full rounds)
    n_accept: int  # draft tokens accepted
    n_prompt_tokens: int | None  # what llama.cpp tokenized the prompt to ("encoded N tokens")
    accepted: list[int] | None = None  # per round, when the verbose log kept every round
    drafted: list[int] | None = None
    attempts: int = 1
    tau_known: bool = True

    def committed_accepted(self) -> tuple[int, int]:
        return self.n_predict, self.n_accept

    def drafted_accepted(self) -> tuple[int, int]:
        return self.n_drafted, self.n_accept


class PerPromptTau:
    """τ over prompts of a run with ``runs`` (each with a ``tau``): both runtimes' drafter runs share it."""

    runs: list[Any]

    @property
    def taus(self) -> list[float]:
        return [r.tau for r in self.runs]

    @property
    def tau(self) -> float:
        """Mean over prompts of per-prompt τ (prompts without a round are left out)."""
        return mean_tau(self.taus)


class CountedRuns(PerPromptTau):
    """A `PerPromptTau` whose runs are `CountedRounds`: the draft tokens proposed and accepted over every prompt,
    and their ratio — llama.cpp's "draft acceptance rate" (speculative-simple and llama-server alike)."""

    runs: list[CountedRounds]

    @property
    def drafted(self) -> int:
        return sum(r.drafted_accepted()[0] for r in self.runs)

    @property
    def accepted(self) -> int:
        return sum(r.drafted_accepted()[1] for r in self.runs)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else math.nan


@dataclass
class LlamaCppDrafterRun(CountedRuns):
    """One drafter over every prompt: ``runs[i]`` ↔ prompt i, or ``refused`` (llama.cpp's own message)."""

    path: str
    gguf: str
    runs: list[LlamaCppPromptRun] = field(default_factory=list)
    refused: str | None = None  # llama.cpp's reason, or the crash (``crashed``)
    crashed: bool = False
    note: str | None = None  # NO_REPACK_NOTE when it ran again with --no-repack after a repacking crash


class LlamaCppRefused(DFlashError):
    """llama.cpp would not load or run the pair; the message is its own."""


class LlamaCppLogLost(DFlashError):
    """llama-speculative-simple exited 0 every time but its counts never reached the log."""


def find_binary(bin_dir: str | os.PathLike) -> Path:
    """``BIN_DIR/llama-speculative-simple``, or a usage error saying what to pass."""
    return executable(bin_dir, SPECULATIVE_BINARY, "--llama-cpp", SPECULATIVE_BINARY)


def refusal_message(output: str) -> str:
    """llama.cpp's own reason for not loading or not running: its first error line, as printed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for needle in ("error loading model", "failed to load", "error:", "key not found", "GGML_ASSERT", "error"):
        for line in lines:
            if needle in line:
                return last_lines(line, 1)  # cut: one line of a hostile build can be megabytes
    return last_lines(output, 1)


def parse_counts(stderr: str) -> tuple[int, int, int] | None:
    """(n_predict, n_drafted, n_accept) from the end-of-run statistics, or None when any is missing."""
    found = {k: int(v) for k, v in _COUNT.findall(stderr)}
    if not all(k in found for k in ("n_predict", "n_drafted", "n_accept")):
        return None
    return found["n_predict"], found["n_drafted"], found["n_accept"]


def check_counts(program: str, where: str, n_predict: int, n_drafted: int, n_accept: int, draft_max: int) -> None:
    """Counts that cannot be (negative, more accepted than drafted or committed, τ above the block) are refused:
    a measurement built on them would be a wrong number with a straight face. ``n_predict``: the tokens the
    draft–verify rounds committed."""
    problem = None
    if min(n_predict, n_drafted, n_accept) < 0:
        problem = "a negative count"
    elif n_accept > n_drafted:
        problem = "more draft tokens accepted than drafted"
    elif n_predict > 0 and n_accept >= n_predict:
        problem = "every committed token accepted from a draft (no target round)"
    elif n_predict > 0 and n_predict / (n_predict - n_accept) > draft_max + 1:
        problem = f"τ {n_predict / (n_predict - n_accept):.2f} above the block of {draft_max + 1} tokens"
    if problem is not None:
        raise DFlashError(f"{where}: {program} reported impossible counts ({problem}: predicted {n_predict}, drafted "
                          f"{n_drafted}, accepted {n_accept}) — refused, not reported; is this a llama.cpp build "
                          "dflashkit knows (docs: the llama.cpp checks)?")


def context_size(prompt_tokens: int, n_predict: int, draft_max: int) -> int:
    """The ``-c`` `run_prompt` gives llama-speculative-simple: the prompt, twice the generation and the block."""
    return max(512, prompt_tokens + 2 * (n_predict + draft_max) + 64)


def run_prompt(
    binary: Path, target_gguf: str | os.PathLike, drafter_gguf: str | os.PathLike, text: str, *,
    n_predict: int, draft_max: int, threads: int = 1, ctx_size: int | None = None, retries: int = RETRIES,
    timeout: float = TIMEOUT_S, prompt_tokens: int | None = None, ignore_eos: bool = False,
    extra_args: Sequence[str] = (), label: str | None = None,
) -> LlamaCppPromptRun:
    """Greedy speculative decoding of ``text`` in llama.cpp; raises `LlamaCppRefused` when it will not run.

    The context holds the prompt (``prompt_tokens``, as the reference tokenized it), the generation and a draft
    block with room to spare, so llama.cpp never clips a draft to fit. ``--no-escape``: the text goes in as the
    reference runtime reads it (llama.cpp would turn a literal backslash-n into a newline). Messages name
    ``label`` (the drafter as the user gave it) rather than a converted file in a temporary folder."""
    check_prompt_text(text)
    name = label or str(drafter_gguf)
    ctx = ctx_size or context_size(prompt_tokens or len(text), n_predict, draft_max)
    cmd = [str(binary), "-m", str(target_gguf), "-md", str(drafter_gguf), "--spec-type", spec_type_of(drafter_gguf),
           "--spec-draft-n-max", str(draft_max), "-p", text, "--no-escape", "-n", str(n_predict), "--temp", "0",
           "--top-k", "1", "-t", str(threads), "-c", str(ctx), "-b", str(ctx), "-ub", str(ctx), "--verbose"]
    if ignore_eos:
        cmd.append("--ignore-eos")
    cmd += check_extra_args(extra_args)
    last = ""
    for attempt in range(1, retries + 1):
        try:
            # stdout (the prompt echo and the generated text) is never read; stderr is kept bounded (head + tail)
            returncode, output = run_bounded(cmd, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DFlashError(f"{name}: {SPECULATIVE_BINARY} did not finish in {timeout:g} s "
                              "(--llama-cpp-timeout)") from None
        # the counts are read from stderr only: stdout carries the prompt echo and the generated text
        if returncode < 0:  # died by a signal: a crash in llama.cpp, not a verdict on the file
            phase = "generating" if _ENCODED.search(output) else "loading"
            raise LlamaCppCrashed(crash_message(SPECULATIVE_BINARY, returncode, output, phase, extra_args),
                                  repack=repacking_crash(returncode, output, phase, extra_args))
        if returncode != 0:
            raise LlamaCppRefused(refusal_message(output))
        if any(m in output for m in _CUT_SHORT):  # it broke out of its loop, then printed counts and exited 0
            cut = next(line for line in output.splitlines() if any(m in line for m in _CUT_SHORT))
            raise LlamaCppRefused(last_lines(cut, 1))
        counts = parse_counts(output)
        if counts is None:
            last = output
            continue
        n_pred, n_drafted, n_accept = counts
        check_counts(SPECULATIVE_BINARY, name, n_pred, n_drafted, n_accept, draft_max)
        encoded = _ENCODED.search(output)
        rounds = [(int(a), int(d)) for a, d in _ROUND.findall(output)]
        per_round = None
        if rounds and sum(a for a, _ in rounds) == n_accept and sum(a + 1 for a, _ in rounds) == n_pred:
            per_round = rounds  # every round made it into the log
        return LlamaCppPromptRun(
            n_predict=n_pred, n_drafted=n_drafted, n_accept=n_accept,
            n_prompt_tokens=int(encoded.group(1)) if encoded else None,
            accepted=[a for a, _ in per_round] if per_round else None,
            drafted=[d for _, d in per_round] if per_round else None,
            attempts=attempt,
        )
    raise LlamaCppLogLost(f"{name}: {SPECULATIVE_BINARY} exited 0 {retries} times without printing its "
                          f"n_predict / n_drafted / n_accept (its log loses its last lines on a busy machine; "
                          f"rerun on a quieter one) — last lines: {last_lines(last, 2)}")


def run_drafter(
    binary: Path, target_gguf: str | os.PathLike, drafter_path: str, drafter_gguf: str | os.PathLike,
    texts: Sequence[str], *, n_predict: int, draft_max: int, threads: int = 1,
    progress: Callable[[str], None] | None = None, prompt_tokens: Sequence[int] | None = None,
    ignore_eos: bool = False, extra_args: Sequence[str] = (), retries: int = RETRIES, timeout: float = TIMEOUT_S,
) -> LlamaCppDrafterRun:
    """Every prompt through llama.cpp with one drafter; a refusal on any prompt ends it (kept, with llama.cpp's
    message, and the drafter gets no τ: a file llama.cpp refuses for some prompts is not one to ship)."""
    say = progress or (lambda message: None)
    out = LlamaCppDrafterRun(drafter_path, str(drafter_gguf))
    args = list(extra_args)

    def once(i: int, text: str) -> LlamaCppPromptRun:
        return run_prompt(binary, target_gguf, drafter_gguf, text, n_predict=n_predict, draft_max=draft_max,
                          threads=threads, prompt_tokens=prompt_tokens[i] if prompt_tokens else None,
                          ignore_eos=ignore_eos, extra_args=args, retries=retries, timeout=timeout,
                          label=drafter_path)

    for i, text in enumerate(texts):
        try:
            try:
                r = once(i, text)
            except LlamaCppCrashed as exc:
                if not exc.repack:
                    raise
                say(f"llama.cpp crashed loading {drafter_path} with weight repacking: once more with --no-repack")
                args, out.note = [*args, "--no-repack"], NO_REPACK_NOTE  # the later prompts too: one setting
                r = once(i, text)
        except (LlamaCppRefused, LlamaCppCrashed) as exc:
            out.refused, out.runs, out.crashed = str(exc), [], isinstance(exc, LlamaCppCrashed)
            say(f"llama.cpp {'crashed on' if out.crashed else 'refused'} {drafter_path}: {exc}")
            return out
        out.runs.append(r)
        say(f"llama.cpp {Path(drafter_path).name}: prompt {i + 1}/{len(texts)}: τ {r.tau:.2f} over {r.rounds} round(s)")
    return out
