"""``llama-server`` as users deploy it: started on a free loopback port, asked over HTTP, always stopped.

`LlamaServer` starts ``BIN_DIR/llama-server -m TARGET [-md DRAFTER --spec-type draft-dflash …]`` on 127.0.0.1
(a port the kernel picked a moment before), waits for ``/health`` and stops it when the ``with`` block ends —
normally, on an error, on Ctrl-C, and on TERM / HUP (which unwind: `dflashkit.files.signals_unwind`); killed
outright, the kernel ends it (``PR_SET_PDEATHSIG``, `process`). `RemoteServer` asks a server the user already runs
(``--server-url``) and never starts or stops anything.

Every figure is read from the server's JSON response to ``POST /completion`` (``timings.predicted_n``,
``predicted_ms``, ``draft_n``, ``draft_n_accepted`` and, with ``return_tokens``, the generated ``tokens``): a reply
arrives whole or not at all, unlike the program's log, which llama.cpp never flushes at exit
(ggml-org/llama.cpp#22142). Neither llama.cpp build dflashkit checks takes per-request ``speculative.*`` settings
(compiled out in ``server-schema.cpp``), so the target alone is a second server without ``-md``.

The child's output is read by a thread into a bounded tail (a chatty or hostile build cannot fill memory or
block on a full pipe); the tail is what a refusal or a crash quotes.
"""

from __future__ import annotations

import collections
import math
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..bounds import escape_name
from ..errors import DFlashError
from .http import ExchangeFailed, ExchangeTimeout, Reply, exchange, parse_json_reply, split_url
from .process import (LlamaCppCrashed, check_extra_args, crash_message, executable, last_lines, poll_child, popen,
                      repacking_crash, spec_type_of, stop, wait_child)
from .speculative_simple import (LlamaCppDrafterRun, LlamaCppPromptRun, LlamaCppRefused, CountedRounds,
                                 refusal_message)

SERVER_BINARY = "llama-server"
HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 600.0
#: a reply larger than this is no completion of a few hundred tokens: refused before it is parsed
MAX_REPLY_BYTES = 16 * 1024 * 1024  # a completion of 10,000 tokens with their ids is well under 1 MiB
TAIL_LINES = 200
TAIL_LINE_CHARS = 2000


@dataclass(frozen=True)
class Completion(CountedRounds):
    """One greedy completion as the server reports it."""

    tokens: list[int]  # the generated token ids
    predicted_n: int  # generated tokens, the first (sampled from the prompt's logits) included
    predicted_ms: float  # from the first generated token to the last: the prompt's prefill is not in it
    draft_n: int  # draft tokens proposed (0 for the target alone)
    draft_accepted: int
    prompt_n: int | None  # prompt tokens the server processed
    speculated: bool = False  # the reply carries draft counts (the server leaves them out when it never drafted)
    stop_type: str | None = None  # "limit" (n_predict reached), "eos", "word"…
    slot: int | None = None  # the server's slot that ran it (its reply's id_slot)

    @property
    def decoded(self) -> int:
        """Tokens committed after the first: what the decode forwards (and ``predicted_ms``) produced."""
        return max(self.predicted_n - 1, 0)

    def committed_accepted(self) -> tuple[int, int]:
        """What the decode forwards committed (the prefill's first token is not a round)."""
        return self.decoded, self.draft_accepted

    def drafted_accepted(self) -> tuple[int, int]:
        return self.draft_n, self.draft_accepted

    @property
    def ended_early(self) -> bool:
        """An end token or a stop word ended the generation before ``n_predict`` (`ENDED_EARLY`)."""
        return self.stop_type in ENDED_EARLY

    @property
    def tau_known(self) -> bool:
        """Whether τ of this reply is a measurement: a speculative reply that ended at an end token or a stop word
        may count up to a round's draft as accepted that was never generated (both builds count a round's accepted
        draft before they stop committing it), and which round it was is not in the reply — so its τ is left out
        (NaN), never corrected."""
        return not (self.ended_early and self.speculated and self.draft_accepted > 0)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed as the server computes it (``predicted_per_second``): tokens after the first per second."""
        return self.decoded / self.predicted_ms * 1e3 if self.predicted_ms > 0 and self.decoded else math.nan


def _int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DFlashError(f"{where}: the server's reply has no integer {key} ({type(value).__name__})")
    return value


#: the fastest decode any reply may claim: 1 µs per generated token (a reply of 1e-300 ms is no measurement)
MIN_MS_PER_TOKEN = 1e-3
#: a reply's own time may exceed the wall time dflashkit waited for it by this much (clock granularity)
WALL_SLACK_MS, WALL_SLACK_FRACTION = 50.0, 0.01
#: how a reply ends when an end token or a stop word cut the generation (not the n_predict limit)
ENDED_EARLY = ("eos", "word")


@dataclass(frozen=True)
class Limits:
    """What one request allows a reply to say: its ``n_predict``, the most draft tokens a round can carry (None:
    the server runs no drafter, so a reply with draft counts is impossible), the vocabulary (token ids below it)
    the wall time the exchange took (a reply cannot have generated for longer) and the slots the server was started
    with (a reply's ``id_slot`` names one of them)."""

    n_predict: int
    draft_max: int | None
    vocab: int | None = None
    elapsed_ms: float | None = None
    slots: int | None = None  # the server's -np: a reply's id_slot is one of 0 … slots − 1 (None: not known)


def _impossible(where: str, what: str) -> DFlashError:
    return DFlashError(f"{where}: llama-server reported impossible figures ({what}) — refused, not reported")


def _shown(value: Any) -> str:
    """A value of a reply in a message: short, and nothing of it that could end the line."""
    return escape_name(repr(value), limit=40)


def parse_completion(body: bytes, where: str, limits: Limits) -> Completion:
    """A ``/completion`` reply, checked against what the request allows (`Limits`) — or a one-line error naming the
    figure and the bound. Nothing is corrected: a figure that cannot be is refused."""
    doc = parse_json_reply(body, where)
    if not isinstance(doc, dict) or not isinstance(doc.get("timings"), dict):
        raise DFlashError(f"{where}: the server's reply has no timings (is it llama-server?)")
    t = doc["timings"]
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in tokens):
        raise DFlashError(f"{where}: the server's reply has no generated token ids (a llama-server without "
                          "return_tokens?)")
    predicted_ms = t.get("predicted_ms")
    if isinstance(predicted_ms, bool) or not isinstance(predicted_ms, (int, float)) or not math.isfinite(predicted_ms) \
            or predicted_ms < 0:
        raise DFlashError(f"{where}: the server's reply has no finite timings.predicted_ms ({predicted_ms!r})")
    stop_type = doc.get("stop_type") if isinstance(doc.get("stop_type"), str) else None
    slot = doc.get("id_slot")
    # llama-server names the slot of every reply (both pinned builds' server-task.cpp): one it was not started with,
    # or none at all, cannot be credited to a slot
    if limits.slots is not None and (type(slot) is not int or not 0 <= slot < limits.slots):
        shown = f"id_slot {_shown(slot)}" if "id_slot" in doc else "no id_slot"
        raise _impossible(where, f"{shown} from a server of {limits.slots} slot(s) (-np {limits.slots}): its slots "
                                 f"are 0 to {limits.slots - 1}")
    speculated = "draft_n" in t or "draft_n_accepted" in t
    c = Completion(tokens=list(tokens), predicted_n=_int(t.get("predicted_n"), "timings.predicted_n", where),
                   predicted_ms=float(predicted_ms), draft_n=_int(t.get("draft_n", 0), "timings.draft_n", where),
                   draft_accepted=_int(t.get("draft_n_accepted", 0), "timings.draft_n_accepted", where),
                   prompt_n=t.get("prompt_n") if isinstance(t.get("prompt_n"), int) else None,
                   speculated=speculated, stop_type=stop_type,
                   slot=slot if type(slot) is int and 0 <= slot < 1 << 16 else None)
    check_completion(c, where, limits)
    return c


def check_completion(c: Completion, where: str, limits: Limits) -> None:
    """Every count and time of ``c`` against `Limits` (`parse_completion`)."""
    if not 0 <= c.predicted_n <= limits.n_predict:
        raise _impossible(where, f"predicted_n {c.predicted_n} for a request of n_predict {limits.n_predict}")
    if c.predicted_n != len(c.tokens):
        raise _impossible(where, f"predicted_n {c.predicted_n} for {len(c.tokens)} generated tokens")
    if limits.vocab is not None:
        outside = next((x for x in c.tokens if not 0 <= x < limits.vocab), None)
        if outside is not None:
            raise _impossible(where, f"token id {outside} outside the target's vocabulary of {limits.vocab}")
    if c.decoded and c.predicted_ms < MIN_MS_PER_TOKEN * c.decoded:
        raise _impossible(where, f"predicted_ms {c.predicted_ms:g} for {c.decoded} decoded tokens: under "
                                 f"{MIN_MS_PER_TOKEN * 1e3:g} µs a token")
    if limits.elapsed_ms is not None and \
            c.predicted_ms > limits.elapsed_ms * (1 + WALL_SLACK_FRACTION) + WALL_SLACK_MS:
        raise _impossible(where, f"predicted_ms {c.predicted_ms:g} for a reply that took {limits.elapsed_ms:.0f} ms "
                                 "to arrive")
    if limits.draft_max is None:
        if c.speculated:
            raise _impossible(where, f"draft counts (draft_n {c.draft_n}) from a server that runs no drafter")
        return
    if min(c.draft_n, c.draft_accepted) < 0:
        raise _impossible(where, f"a negative count: drafted {c.draft_n}, accepted {c.draft_accepted}")
    if c.draft_accepted > c.draft_n:
        raise _impossible(where, f"more draft tokens accepted than drafted: drafted {c.draft_n}, accepted "
                                 f"{c.draft_accepted}")
    n_max = limits.draft_max
    # an end token or a stop word inside an accepted draft: both builds count the whole draft as accepted before
    # they stop committing, so the last round may count up to n_max tokens that were never generated
    over = n_max if c.ended_early and c.speculated else 0
    rounds_at_most = min(c.decoded, c.decoded - c.draft_accepted + over)  # a round commits at least one token
    if c.decoded and rounds_at_most < 1:
        raise _impossible(where, f"every committed token accepted from a draft, no target round: {c.decoded} "
                                 f"decoded, {c.draft_accepted} accepted")
    if c.draft_n > max(rounds_at_most, 0) * n_max:
        raise _impossible(where, f"{c.draft_n} draft tokens in at most {max(rounds_at_most, 0)} round(s) of at most "
                                 f"{n_max}")
    if not c.ended_early and c.decoded and c.tau > n_max + 1:
        raise _impossible(where, f"τ {c.tau:.2f} above the {n_max + 1} tokens a round of n-max {n_max} commits: "
                                 f"{c.decoded} decoded, {c.draft_accepted} accepted")


def completion_request(prompt: str, n_predict: int, seed: int, ignore_eos: bool) -> dict[str, Any]:
    """The same greedy request for every server: top-1, no prompt cache (each run prefills), token ids back."""
    return {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": seed,
            "cache_prompt": False, "return_tokens": True, "stream": False, "ignore_eos": ignore_eos}


class _Client:
    url: str
    draft_max: int | None = None
    vocab: int | None = None
    slots: int | None = None  # -np of a server dflashkit started (a server the user runs: not known)
    label: str = SERVER_BINARY
    #: the server runs a drafter: a reply without draft counts means it serves without one (`not_drafting`)
    expects_drafts: bool = False
    request_timeout: float = REQUEST_TIMEOUT_S

    def _exchange(self, path: str, payload: dict[str, Any] | None, timeout: float) -> Reply:
        """One exchange under one deadline (`http.exchange`): a redirect or an HTTP error is a one-line error."""
        try:
            reply = exchange(self.url, path, deadline=time.monotonic() + timeout, payload=payload,
                             max_bytes=MAX_REPLY_BYTES)
        except ExchangeTimeout:
            what = "a completion" if path == "/completion" else path
            raise self._failed(f"did not answer {what} in {timeout:g} s (raise --llama-cpp-timeout for a slow "
                               "machine or a big model)") from None
        except ExchangeFailed as exc:
            raise self._failed(f"did not answer {path} ({exc})") from None
        if 300 <= reply.status < 400:
            raise self._failed(f"answered {path} with a redirect (HTTP {reply.status} to "
                               f"{escape_name(str(reply.location), limit=120)}): redirects are not followed — give "
                               "the server's own URL")
        if reply.status != 200:
            detail = reply.body[:4000].decode("utf-8", "replace")
            raise self._failed(f"answered HTTP {reply.status} to {path}: {escape_name(last_lines(detail, 1))}")
        return reply

    def complete(self, prompt: str, n_predict: int, *, seed: int = 0, ignore_eos: bool = False,
                 timeout: float | None = None) -> Completion:
        timeout = self.request_timeout if timeout is None else timeout
        reply = self._exchange("/completion", completion_request(prompt, n_predict, seed, ignore_eos), timeout)
        c = parse_completion(reply.body, self.label, Limits(n_predict, self.draft_max, self.vocab,
                                                            reply.elapsed_s * 1e3, self.slots))
        if self.expects_drafts and not c.speculated and c.decoded >= 2:  # one token leaves no room for a draft
            raise self.not_drafting()
        return c

    def _failed(self, what: str) -> DFlashError:
        return DFlashError(f"{self.label} at {self.url} {what}")

    def not_drafting(self) -> DFlashError:
        """A server meant to speculate answered without draft counts: it runs without its drafter."""
        return DFlashError(f"{self.label} at {self.url} generated without drafting (no draft_n in its timings): it "
                           "runs without a drafter — start it with -md DRAFTER.gguf --spec-type draft-dflash")


class RemoteServer(_Client):
    """A server the user runs (``--server-url``): asked, never started or stopped. ``draft_max``: the most draft
    tokens a round of it can carry (the drafter's block − 1: llama.cpp clamps its n-max there), None for the target
    alone (``--baseline-url``), whose replies must then carry no draft counts."""

    def __init__(self, url: str, *, label: str | None = None, request_timeout: float = REQUEST_TIMEOUT_S,
                 expects_drafts: bool = False, draft_max: int | None = None, vocab: int | None = None) -> None:
        self.url = url.rstrip("/")
        self.request_timeout, self.expects_drafts = request_timeout, expects_drafts
        self.draft_max, self.vocab = draft_max, vocab
        self.label = label or f"llama-server {self.url}"
        if not self.url.startswith(("http://", "https://")):
            raise DFlashError(f"--server-url {url}: give an http:// or https:// URL (e.g. http://127.0.0.1:8080)")
        try:
            split_url(self.url)
            reply = exchange(self.url, "/health", deadline=time.monotonic() + request_timeout, max_bytes=1 << 16)
            why = None if reply.status == 200 else (
                f"a redirect (HTTP {reply.status}), not followed" if 300 <= reply.status < 400 else
                f"HTTP {reply.status}")
        except ExchangeTimeout:
            why = f"no answer in {request_timeout:g} s"
        except (ExchangeFailed, DFlashError) as exc:
            why = str(exc)
        if why is not None:
            raise DFlashError(f"{self.url}/health: no llama-server ready there ({escape_name(why, limit=200)}) — "
                              "start it first, or pass --llama-server BIN_DIR to let dflashkit start one")


def find_server(bin_dir: str | Path) -> Path:
    """``BIN_DIR/llama-server``, or a usage error saying what to pass."""
    return executable(bin_dir, SERVER_BINARY, "--llama-server", SERVER_BINARY)


def has_server(bin_dir: str | Path) -> bool:
    path = Path(bin_dir) / SERVER_BINARY
    return path.is_file() and os.access(path, os.X_OK)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class LlamaServer(_Client):
    """``llama-server`` for one (target, drafter, draft cache type, draft n-max); a context manager."""

    def __init__(self, bin_dir: str | Path, target_gguf: str | Path, drafter_gguf: str | Path | None = None, *,
                 draft_max: int | None = None, draft_cache_type: str | None = None, ctx_size: int = 4096,
                 threads: int = 1, extra_args: Sequence[str] = (), startup_timeout: float = STARTUP_TIMEOUT_S,
                 option: str = "--llama-server", spec_type: str | None = None,
                 request_timeout: float = REQUEST_TIMEOUT_S, vocab: int | None = None, parallel: int = 1) -> None:
        self.binary = executable(bin_dir, SERVER_BINARY, option, SERVER_BINARY)
        self.parallel = self.slots = parallel  # -np (ctx_size is all of them together, llama-server splits it)
        self.target_gguf, self.drafter_gguf = str(target_gguf), None if drafter_gguf is None else str(drafter_gguf)
        if drafter_gguf is not None and draft_max is None:
            raise ValueError("a server with a drafter is started with its draft n-max (the bound of every reply)")
        self.draft_max = draft_max if drafter_gguf is not None else None
        self.vocab = vocab
        self.expects_drafts = drafter_gguf is not None
        self.draft_cache_type, self.ctx_size, self.threads = draft_cache_type, ctx_size, threads
        self.spec_type = spec_type or (spec_type_of(self.drafter_gguf) if self.drafter_gguf else None)
        self.extra_args = check_extra_args(extra_args)
        self.startup_timeout, self.request_timeout = startup_timeout, request_timeout
        self.label = f"{SERVER_BINARY} ({Path(self.drafter_gguf).name if self.drafter_gguf else 'target alone'})"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.url = ""
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._reader: threading.Thread | None = None

    def command(self, port: int) -> list[str]:
        cmd = [str(self.binary), "-m", self.target_gguf, "--host", HOST, "--port", str(port), "-c",
               str(self.ctx_size), "-np", str(self.parallel), "-t", str(self.threads), "--no-webui"]
        if self.drafter_gguf is not None:
            cmd += ["-md", self.drafter_gguf, "--spec-type", self.spec_type or "draft-dflash"]
            if self.draft_max is not None:
                cmd += ["--spec-draft-n-max", str(self.draft_max)]
            if self.draft_cache_type is not None:
                cmd += ["-ctkd", self.draft_cache_type, "-ctvd", self.draft_cache_type]
        return cmd + self.extra_args

    @property
    def output(self) -> str:
        return "\n".join(list(self._tail))

    def _read(self, stream: Any) -> None:
        for raw in iter(lambda: stream.readline(TAIL_LINE_CHARS * 4), b""):  # a line without end is cut
            self._tail.append(raw[:TAIL_LINE_CHARS].decode("utf-8", "replace").rstrip())

    def start(self) -> "LlamaServer":
        for _attempt in range(3):  # another process may take the picked port before the server binds it
            self.port = free_port()
            self.url = f"http://{HOST}:{self.port}"
            self._tail.clear()
            self.proc = popen(self.command(self.port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
            self._reader.start()
            try:
                if self._wait_ready():
                    return self
            except BaseException:
                self.stop()
                raise
            self.stop()
        raise DFlashError(f"{self.label}: could not bind a free port on {HOST} in 3 tries")

    def _wait_ready(self) -> bool:
        """True once /health answers 200; False when the port was taken; an error when the server ends."""
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = poll_child(self.proc)
            if code is not None:
                if self._reader is not None:
                    self._reader.join(timeout=2)
                if code >= 0 and any("bind" in line.lower() and "port" in line.lower() for line in list(self._tail)):
                    return False
                raise self._ended(code, "loading")
            try:  # each poll bounded as a whole: a server that trickles /health cannot hold the start-up
                reply = exchange(self.url, "/health", deadline=min(time.monotonic() + 2, deadline), max_bytes=1 << 16)
                if reply.status == 200:
                    return True
            except (ExchangeTimeout, ExchangeFailed, DFlashError):
                pass  # 503 while loading, or not listening yet
            time.sleep(0.05)
        raise DFlashError(f"{self.label}: not ready {self.startup_timeout:g} s after start (--llama-cpp-timeout) — "
                          f"last lines: {last_lines(self.output)}")

    def _ended(self, code: int, phase: str) -> DFlashError:
        """Why the server ended: a signal, or any end once it served (/health answered), is a crash; an exit while
        loading is a refusal of the files."""
        files = self.target_gguf + (f" + {self.drafter_gguf}" if self.drafter_gguf else "")
        if code < 0 or phase == "generating":
            return LlamaCppCrashed(f"{files}: " + crash_message(SERVER_BINARY, code, self.output, phase,
                                                               self.extra_args),
                                   repack=repacking_crash(code, self.output, phase, self.extra_args))
        return LlamaCppRefused(f"{refusal_message(self.output)} (exit {code})")

    def _failed(self, what: str) -> DFlashError:
        if self.proc is not None:
            code = wait_child(self.proc, 2)
            if code is not None:
                if self._reader is not None:
                    self._reader.join(timeout=2)
                return self._ended(code, "generating")
        return super()._failed(what)

    def not_drafting(self) -> DFlashError:
        # llama-server logs the failure and serves on without speculation (both builds): say so, with its reason
        reason = next((line for line in list(self._tail) if "specul" in line.lower() and "fail" in line.lower()),
                      "no draft_n in its timings")
        return LlamaCppRefused(f"{self.label} generated without drafting, so the drafter was not used: {reason}")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            if self._reader is not None:
                # a grandchild that left the group (setsid) may hold the pipe open: the reader then never sees its
                # end, and closing the pipe under it would block on its buffer's lock — leave both to the daemon
                # thread (the descriptor goes with the process) rather than wait for that grandchild
                self._reader.join(timeout=2)
            if self.proc.stdout is not None and (self._reader is None or not self._reader.is_alive()):
                self.proc.stdout.close()

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_drafter_server(
    bin_dir: str | Path, target_gguf: str | Path, drafter_path: str, drafter_gguf: str | Path, texts: Sequence[str],
    *, n_predict: int, draft_max: int, threads: int = 1, progress: Callable[[str], None] | None = None,
    prompt_tokens: Sequence[int] | None = None, ignore_eos: bool = False, extra_args: Sequence[str] = (),
    seed: int = 0, timeout: float = REQUEST_TIMEOUT_S, vocab: int | None = None,
) -> LlamaCppDrafterRun:
    """τ in llama.cpp through one llama-server with the drafter: the counts of every prompt from its JSON (they
    cannot be lost, unlike ``llama-speculative-simple``'s log). A refusal or a crash ends the drafter's run (kept
    with its message, as `run_drafter` does)."""
    say = progress or (lambda message: None)
    out = LlamaCppDrafterRun(drafter_path, str(drafter_gguf))
    ctx = (max(prompt_tokens) if prompt_tokens else 512) + 2 * (n_predict + draft_max) + 64
    try:
        with LlamaServer(bin_dir, target_gguf, drafter_gguf, draft_max=draft_max, ctx_size=ctx, threads=threads,
                         extra_args=extra_args, option="--llama-cpp", startup_timeout=timeout,
                         request_timeout=timeout, vocab=vocab) as server:
            for i, text in enumerate(texts):
                c = server.complete(text, n_predict, seed=seed + i, ignore_eos=ignore_eos)
                out.runs.append(LlamaCppPromptRun(n_predict=c.decoded, n_drafted=c.draft_n, n_accept=c.draft_accepted,
                                                  n_prompt_tokens=c.prompt_n, tau_known=c.tau_known))
                say(f"llama-server {Path(drafter_path).name}: prompt {i + 1}/{len(texts)}: τ {c.tau:.2f} over "
                    f"{c.rounds} round(s)")
    except (LlamaCppRefused, LlamaCppCrashed) as exc:
        out.refused, out.runs, out.crashed = str(exc), [], isinstance(exc, LlamaCppCrashed)
        say(f"llama-server {'crashed on' if out.crashed else 'refused'} {drafter_path}: {exc}")
    return out
