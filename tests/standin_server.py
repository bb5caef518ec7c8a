"""A stand-in ``llama-server`` for the tests that must run without a llama.cpp build.

It answers ``/health`` and ``/completion`` the way llama-server does (the JSON fields dflashkit reads), records its
argv and pid, and misbehaves on request: the file ``mode`` beside it names how (``segv`` at start, ``refuse``,
``segv-generate``, ``base-segv-generate`` (the target alone dies), ``hang``, ``impossible``, ``no-draft``,
``http-error``, ``amx`` (dies loading a drafter with weight repacking on, as ggml on an AMX CPU: fine with
``--no-repack``), ``amx-q8`` (the same for Q8_0 files only), ``segv-q8`` (dies loading any Q8_0 drafter),
``slot1-nodraft`` (with ``-np`` > 1, slots past 0 draft but nothing is accepted: the forks' bug)). Given a fork's
``-cd N``, a request whose prompt (characters / 4) and new tokens pass N drafts nothing that is accepted. With ``-md`` it
reports draft counts and generates twice as fast as without, so the speed-up is ×2 and every verdict is known in
advance. It serves ``-np`` requests at once, each in its own slot (the reply's ``id_slot``).
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

SCRIPT = r'''
import json, os, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

here = Path(sys.argv[0]).resolve().parent
argv = sys.argv[1:]
mode = (here / "mode").read_text().strip() if (here / "mode").exists() else "normal"
with open(here / "pids", "a") as f:
    f.write(f"{os.getpid()}\n")
(here / f"argv-{os.getpid()}").write_text("\n".join(argv))
draft = "-md" in argv
if mode == "setsid-grandchild":  # a grandchild that leaves the group and keeps the server's output pipe open
    import subprocess
    escaped = subprocess.Popen(["setsid", "sleep", "3600"], stdout=sys.stderr, stderr=sys.stderr)
    with open(here / "escaped-pids.txt", "a") as f:
        f.write(f"{escaped.pid}\n")
n_max = int(argv[argv.index("--spec-draft-n-max") + 1]) if "--spec-draft-n-max" in argv else 3
n_slots = int(argv[argv.index("-np") + 1]) if "-np" in argv else 1
# the drafter's time per generated token (the target alone takes twice it); the file ms_per_token sets it
ms_per_token = float((here / "ms_per_token").read_text()) if (here / "ms_per_token").exists() else 0.1
busy, lock = set(), threading.Condition()
# a fork's -cd (the pinned builds have none): past it (prompt characters / 4 + new tokens) nothing is accepted
draft_ctx = int(argv[argv.index("-cd") + 1]) if "-cd" in argv else None
sys.stderr.write("main: loading model\n")
sys.stderr.flush()
if mode == "segv" and draft:
    sys.stderr.write("load_tensors: loading model tensors\nggml_backend_amx_buffer_set_tensor: repack fc.weight\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
if mode.startswith("amx") and draft and "--no-repack" not in argv and (mode == "amx" or "Q8_0" in argv[argv.index("-md") + 1]):
    # ggml's weight repacking on an AMX CPU: the log names the repacked buffer and the model's absolute path, then dies
    sys.stderr.write(f"llama_model_loader: loaded meta data from {os.path.abspath(argv[argv.index('-md') + 1])}\n"
                     "load_tensors: CPU_REPACK model buffer size = 1.00 MiB\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
if mode == "segv-q8" and draft and "Q8_0" in argv[argv.index("-md") + 1]:  # crashes on Q8_0 files whatever it is given
    sys.stderr.write(f"llama_model_loader: loaded meta data from {os.path.abspath(argv[argv.index('-md') + 1])}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
if mode == "refuse" and draft:
    sys.stderr.write("llama_model_load: error loading model: missing tensor fc.weight\n"
                     "srv    load_model: failed to load draft model\n")
    sys.exit(1)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply(200, {"status": "ok"})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = request["n_predict"]
        if draft and mode == "hang":
            (here / "request-arrived").write_text(str(os.getpid()))
            time.sleep(3600)
        if draft and mode == "segv-generate":
            os.kill(os.getpid(), signal.SIGSEGV)
        if not draft and mode == "base-segv-generate":
            os.kill(os.getpid(), signal.SIGSEGV)
        if draft and mode == "http-error":
            self.reply(500, {"error": {"code": 500, "message": "the draft context failed"}})
            return
        with lock:
            slot = min(set(range(n_slots)) - busy) if len(busy) < n_slots else n_slots - 1
            busy.add(slot)
            lock.notify_all()  # a batch runs together: each request waits (≤ 1 s) until every slot is taken
            lock.wait_for(lambda: len(busy) >= n_slots, timeout=1.0)
        try:
            self.generate(request, n, slot)
        finally:
            with lock:
                busy.discard(slot)
                lock.notify_all()

    def generate(self, request, n, slot):
        tokens = [7 + (i % 5) for i in range(n)]
        # 0.1 ms a token with the drafter, 0.2 without: a ×2 speed-up, and the reply takes the time it claims (a
        # reply whose predicted_ms exceeds its own wall time is refused as impossible)
        ms = (n - 1) * (1 if draft else 2) * ms_per_token
        time.sleep(ms / 1e3)
        timings = {"prompt_n": 12, "prompt_ms": 3.0, "predicted_n": n, "predicted_ms": ms}
        if draft and mode != "no-draft":
            rounds = -(-(n - 1) // (n_max + 1))
            accepted = (n - 1) - rounds
            if mode == "slot1-nodraft" and slot > 0:  # drafts every round, none of it accepted: one token a round
                rounds, accepted = n - 1, 0
            if draft_ctx is not None and len(request["prompt"]) // 4 + n > draft_ctx:  # a fork's full draft cache
                rounds, accepted = n - 1, 0
            timings.update(draft_n=rounds * n_max, draft_n_accepted=accepted + (10 * n if mode == "impossible" else 0))
        self.reply(200, {"content": "x" * n, "tokens": tokens, "timings": timings, "stop_type": "limit",
                         "id_slot": slot})


port = int(argv[argv.index("--port") + 1])
host = argv[argv.index("--host") + 1]
ThreadingHTTPServer((host, port), Handler).serve_forever()
'''


def make(folder: Path, mode: str = "normal", ms_per_token: float | None = None) -> Path:
    """``folder/llama-server`` (the stand-in) with ``mode``; returns the folder (a bin/ dir). ``ms_per_token``: the
    drafter's time per token (0.1 ms; slower where wall-clock speed is measured, so HTTP costs do not dominate)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "llama-server"
    script.write_text(f"#!{sys.executable}\n{SCRIPT}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (folder / "mode").write_text(mode)
    if ms_per_token is not None:
        (folder / "ms_per_token").write_text(str(ms_per_token))
    return folder


def pids(folder: Path) -> list[int]:
    f = folder / "pids"
    return [int(x) for x in f.read_text().split()] if f.exists() else []


def argvs(folder: Path) -> list[list[str]]:
    # in the order the servers started (a PID's digits do not sort, and PIDs wrap)
    return [p.read_text().split("\n") for p in sorted(folder.glob("argv-*"), key=lambda p: p.stat().st_mtime_ns)]


def kill_escaped(folder: Path) -> None:
    """Kill the grandchildren a ``setsid-grandchild`` stand-in left (no process group reaches them)."""
    import os
    import signal

    f = folder / "escaped-pids.txt"
    for pid in (int(x) for x in f.read_text().split()) if f.exists() else []:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    """A process that still runs (a zombie, reaped by nobody yet, counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"
