"""dflash-accept --llama-server / --server-url: τ, speed-up against the target alone and identical output.

The first part runs everywhere: the statistics and verdicts on given completions, the reply checks, and a stand-in
llama-server (tests/standin_server.py) for the process rules — the argv dflashkit builds, crashes named by their
signal, refusals, impossible counts, and no server left behind after a normal run, an error, Ctrl-C, TERM or HUP.
The second part starts the real llama-server of each pinned llama.cpp build (CI builds both) on the trained pair.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import standin_server
from dflashkit.errors import DFlashError, UsageError
from dflashkit.llama_cpp import check_extra_args
from dflashkit.llama_cpp.server import Completion, Limits, parse_completion
from dflashkit.accept.serving_measure import (VERDICT_CRASHED, VERDICT_DIFFERS, VERDICT_GAIN, VERDICT_LOSS, VERDICT_NO_GAIN,
                               VERDICT_REFUSED, VERDICT_UNMEASURED, ServingResult, ServingRun, cache_type_value,
                               draft_n_max_value, measure_serving)
from dflashkit.cli.common import parse_list
from interrupting import DEFAULT_SIGNALS, HANG_SECONDS, ROOT, wait_or_kill

# slow: real llama-server runs and server time-outs
pytestmark = pytest.mark.slow

TRAINED = ROOT / "fixtures" / "trained"
TEXTS = ["the old king walks", "a river of glass", "seven small birds", "under the stone bridge"]
NAMES = ["p0", "p1", "p2", "p3"]


def completion(tps: float, tokens: list[int] | None = None, accepted: int = 0, drafted: int = 0) -> Completion:
    tokens = tokens if tokens is not None else list(range(33))
    return Completion(tokens=tokens, predicted_n=len(tokens), predicted_ms=(len(tokens) - 1) / tps * 1e3,
                      draft_n=drafted, draft_accepted=accepted, prompt_n=10, speculated=drafted > 0)


def run_with(off: list[float], on: list[float], **kw: object) -> ServingRun:
    r = ServingRun("t.gguf", "d.gguf", "d.gguf", 15, "f16", **kw)  # type: ignore[arg-type]
    r.off = [completion(x) for x in off]
    r.on = [completion(x, accepted=28, drafted=45) for x in on]
    return r


# ---------------------------------------------------------------------------------------------
# Statistics and verdicts
# ---------------------------------------------------------------------------------------------


def test_speedup_is_the_geometric_mean_with_a_paired_ci() -> None:
    r = run_with([100, 100, 50, 80], [200, 150, 100, 200])
    assert r.speedup == pytest.approx((2 * 1.5 * 2 * 2.5) ** 0.25)
    lo, hi = r.speedup_ci
    assert 1.5 <= lo <= r.speedup <= hi <= 2.5
    assert r.tokens_per_s_off == pytest.approx(4 * 32 / sum(32 / x for x in (100, 100, 50, 80)))
    assert r.verdict(NAMES) == VERDICT_GAIN
    assert r.tau == pytest.approx(32 / 4)  # 32 decoded tokens, 28 accepted: 4 rounds


def test_loss_no_gain_and_one_prompt() -> None:
    assert run_with([100, 100, 100], [70, 80, 75]).verdict(NAMES) == VERDICT_LOSS
    assert run_with([100, 100, 100, 100], [130, 80, 120, 85]).verdict(NAMES) == VERDICT_NO_GAIN
    one = run_with([100], [150])
    assert one.speedup_ci is None and one.verdict(NAMES) == VERDICT_GAIN  # one prompt: its own ratio


def test_output_differs_names_the_prompt_the_position_and_both_tokens() -> None:
    r = run_with([100, 100], [200, 200])
    r.on[1] = completion(200, tokens=[*range(5), 99, *range(6, 33)], accepted=28, drafted=45)
    assert r.verdict(NAMES) == VERDICT_DIFFERS
    (d,) = r.differences(NAMES)
    assert (d.prompt, d.position, d.target_token, d.speculative_token) == ("p1", 5, 5, 99)
    assert d.text() == "prompt p1: generated token 5 is token 99 with the drafter, token 5 from the target alone"
    r.on[1] = completion(200, tokens=list(range(20)), accepted=15, drafted=30)  # stopped early
    assert r.differences(NAMES)[0].text() == ("prompt p1: generated token 20 is end of output with the drafter, "
                                              "token 20 from the target alone")


def test_gate_failures_name_the_combination() -> None:
    gain = run_with([100, 100], [200, 210])
    refused = run_with([], [], refused="llama_model_load: error loading model: missing tensor fc.weight")
    unmeasured = run_with([], [300, 300])
    result = ServingResult([gain, refused, unmeasured], NAMES[:2], 32, "stand-in", 1, [])
    assert result.verdicts() == [VERDICT_GAIN, VERDICT_REFUSED, VERDICT_UNMEASURED]
    assert result.failures(None) == []
    assert result.failures(2.5) == [
        "d.gguf on t.gguf (draft cache f16, n-max 15): speed-up ×2.05 below --min-speedup 2.5",
        "d.gguf on t.gguf (draft cache f16, n-max 15): llama-server refused to load: llama_model_load: error "
        "loading model: missing tensor fc.weight",
        "d.gguf on t.gguf (draft cache f16, n-max 15): no speed-up measured (no target alone: pass --baseline-url)"]


def test_a_server_capped_below_the_drafters_block_is_named() -> None:
    from dflashkit.accept.serving_report import section_context

    def remote(accepted: int, drafted: int, block: int = 16) -> ServingRun:
        r = ServingRun("http://127.0.0.1:8080", "http://127.0.0.1:8080", "http://127.0.0.1:8080", None, None,
                       block_size=block)
        r.on = [completion(100, accepted=accepted, drafted=drafted) for _ in range(3)]
        return r

    # llama-server's default n-max: 32 decoded tokens in 8 rounds of 3 drafted, 3 accepted — τ 4.0
    capped = remote(accepted=24, drafted=24)
    assert (capped.drafts_at_most(), capped.capped_n_max(), capped.tau) == (3, 3, 4.0)
    assert capped.acceptance_rate == 1.0
    context = section_context(ServingResult([capped], NAMES[:3], 32, "http://127.0.0.1:8080", 1, []))
    assert context.capped == [
        "llama-server at http://127.0.0.1:8080: every reply drafted at most 3 token(s) a round and no "
        "prompt's τ passed 4, where the drafter drafts up to 15 (block size 16) — the server's n-max is likely 3. "
        "llama-server drafts at most 3 tokens a round unless told (its default n_max = 3, which its log prints): "
        "start it with --spec-draft-n-max 15, or measure the choice with dflash-accept --llama-server BIN_DIR "
        "--draft-n-max 4,8,15 (docs/serving.md, \"τ lower in my server?\")"]
    # drafting the whole block (4 rounds of 15): no cap; 3 a round from a drafter of block 4 is its whole block
    assert remote(accepted=28, drafted=60).capped_n_max() is None
    assert remote(accepted=24, drafted=24, block=4).capped_n_max() is None
    # a server dflashkit started was given its n-max: the figure is labelled with it, nothing to explain
    ours = run_with([100], [100])
    ours.block_size = 16
    assert ours.capped_n_max() is None
    # rounds that drafted fewer than the cap still bound it from below; a τ above k + 1 rules a cap of k out
    mixed = remote(accepted=10, drafted=25)  # 22 rounds, 25 drafted: at most 2 a round
    assert mixed.drafts_at_most() == 2 and mixed.capped_n_max() == 2
    assert section_context(ServingResult([remote(28, 60)], NAMES[:3], 32, "u", 1, [])).capped == []


def _reply(**timings: object) -> bytes:
    t = {"predicted_n": 5, "predicted_ms": 4.0, "draft_n": 8, "draft_n_accepted": 3, **timings}
    return json.dumps({"tokens": [1, 2, 3, 4, 5], "timings": t}).encode()


LIMITS = Limits(n_predict=5, draft_max=15)


def test_a_reply_is_checked_before_it_counts() -> None:
    c = parse_completion(_reply(), "srv", LIMITS)
    assert (c.decoded, c.draft_n, c.draft_accepted, c.rounds, c.tau) == (4, 8, 3, 1, 4.0)
    impossible = "llama-server reported impossible figures"
    cases = {
        _reply(draft_n_accepted=9): (impossible, "more draft tokens accepted than drafted: drafted 8, accepted 9"),
        _reply(draft_n=-1): (impossible, "a negative count: drafted -1, accepted 3"),
        _reply(draft_n_accepted=4): (impossible, "every committed token accepted from a draft, no target round"),
        _reply(predicted_n=7): (impossible, "predicted_n 7 for a request of n_predict 5"),
        _reply(predicted_n=4): (impossible, "predicted_n 4 for 5 generated tokens"),
        _reply(predicted_ms=None): ("no finite timings.predicted_ms", ""),
        _reply(predicted_ms=1e-300): (impossible, "predicted_ms 1e-300 for 4 decoded tokens: under 1 µs a token"),
        _reply(draft_n="8"): ("no integer timings.draft_n", ""),
        _reply(draft_n=10**30): (impossible, f"{10**30} draft tokens in at most 1 round(s) of at most 15"),
        b"<html>": ("the server's reply is not JSON", ""),
        b"[]," * 20_000: ("the server's reply holds 20000 objects/arrays, over the 10000", ""),
        json.dumps({"timings": {"predicted_n": 1, "predicted_ms": 1.0}}).encode(): ("no generated token ids", ""),
    }
    for body, (message, numbers) in cases.items():
        with pytest.raises(DFlashError, match="srv: ") as err:
            parse_completion(body, "srv", LIMITS)
        assert message in str(err.value) and numbers in str(err.value), (body[:80], str(err.value))
    # τ 63 for a block-16 drafter: 62 accepted in one round cannot be drafted at n-max 15
    tau63 = json.dumps({"tokens": list(range(64)), "timings": {"predicted_n": 64, "predicted_ms": 60.0, "draft_n": 62,
                                                               "draft_n_accepted": 62}}).encode()
    with pytest.raises(DFlashError, match=r"62 draft tokens in at most 1 round\(s\) of at most 15"):
        parse_completion(tau63, "srv", Limits(64, 15))
    with pytest.raises(DFlashError, match="token id 5 outside the target's vocabulary of 5"):
        parse_completion(_reply(), "srv", Limits(5, 15, vocab=5))
    with pytest.raises(DFlashError, match="predicted_ms 400 for a reply that took 1 ms to arrive"):
        parse_completion(_reply(predicted_ms=400.0), "srv", Limits(5, 15, elapsed_ms=1.0))
    parse_completion(_reply(predicted_ms=40.0), "srv", Limits(5, 15, elapsed_ms=1.0))  # within the clock's slack
    with pytest.raises(DFlashError, match=r"draft counts \(draft_n 8\) from a server that runs no drafter"):
        parse_completion(_reply(), "srv", Limits(5, None))


def test_an_end_token_inside_an_accepted_draft_leaves_that_prompt_without_a_tau() -> None:
    # the server counts a draft's accepted tokens before it stops at the end token inside them: 1 token after the
    # first committed, 3 counted as accepted — which round over-counted is not in the reply, so no τ (never a
    # "corrected" one); the counts stay bounded by what a round can carry
    body = json.dumps({"tokens": [5, 6], "stop_type": "eos",
                       "timings": {"predicted_n": 2, "predicted_ms": 1.0, "draft_n": 15, "draft_n_accepted": 3}})
    c = parse_completion(body.encode(), "srv", LIMITS)
    assert (c.decoded, c.draft_accepted, c.tau_known) == (1, 3, False) and math.isnan(c.tau)
    with pytest.raises(DFlashError, match="more draft tokens accepted than drafted"):  # "limit": taken as it is
        parse_completion(body.replace('"eos"', '"limit"').replace('"draft_n": 15', '"draft_n": 2').encode(), "srv",
                         LIMITS)
    with pytest.raises(DFlashError, match="every committed token accepted from a draft"):  # at most n-max over
        parse_completion(body.replace('"draft_n_accepted": 3', '"draft_n_accepted": 15').encode(), "srv",
                         Limits(5, 14))


@pytest.mark.parametrize("arg, flag, why", [
    ("-md", "-md", "loads a model"), ("--port=8081", "--port", "sets the port or host"),
    ("-m", "-m", "loads a model"), ("--spec-draft-n-max", "--spec-draft-n-max", "changes the speculative settings"),
    ("-ctkd", "-ctkd", "changes the speculative settings"),
    ("--spec_draft_n_max=4", "--spec-draft-n-max", "changes the speculative settings"),
    ("--spec-draft-model", "--spec-draft-model", "loads a model"), ("-t", "-t", "sets the threads"),
    ("--fim-qwen-7b-spec", "--fim-qwen-7b-spec", "loads a model"), ("-dr", "-dr", "loads a model"),
    ("-hfd", "-hfd", "loads a model"), ("--host", "--host", "sets the port or host")])
def test_an_argument_dflashkit_sets_is_a_usage_error(arg: str, flag: str, why: str) -> None:
    with pytest.raises(UsageError, match=f"--llama-cpp-arg {re.escape(arg)}: {flag} {why}"):
        check_extra_args(["--no-repack", arg])
    assert check_extra_args(["--no-repack", "-fa", "on"]) == ["--no-repack", "-fa", "on"]


@pytest.mark.parametrize("value, convert, message", [
    ("4,0", draft_n_max_value, "'0' is not a draft length from 1 to 256"),
    ("4,4", draft_n_max_value, "'4' is given twice"),
    ("4,,8", draft_n_max_value, "give values separated by commas"),
    ("x", draft_n_max_value, "invalid literal"),
    ("f16,q9", cache_type_value, "'q9' is not a KV cache type llama.cpp takes"),
])
def test_sweep_lists(value: str, convert: object, message: str) -> None:
    with pytest.raises(UsageError, match="--opt") as err:
        parse_list(value, "--opt", convert)  # type: ignore[arg-type]
    assert message in str(err.value)
    assert parse_list("4, 8,15", "--opt", draft_n_max_value) == [4, 8, 15]
    assert parse_list("F16,q8_0", "--opt", cache_type_value) == ["f16", "q8_0"]


# ---------------------------------------------------------------------------------------------
# The stand-in server
# ---------------------------------------------------------------------------------------------


def _measure(folder: Path, tmp_path: Path, **kw: object):
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    return measure_serving([("d.gguf", tmp_path / "d.gguf", 16)], TEXTS, NAMES, llama_server=folder,
                           target_ggufs=[target], max_new_tokens=33, **kw)  # type: ignore[arg-type]


def test_every_combination_against_one_target_alone(tmp_path: Path) -> None:
    folder = standin_server.make(tmp_path / "bin")
    result = _measure(folder, tmp_path, draft_n_max=[4, 15], draft_cache_types=["f16", "q8_0"],
                      llama_cpp_args=["--no-repack"])
    assert [(r.draft_cache_type, r.draft_n_max) for r in result.runs] == [("f16", 4), ("f16", 15), ("q8_0", 4),
                                                                          ("q8_0", 15)]
    assert result.verdicts() == [VERDICT_GAIN] * 4
    assert all(r.speedup == pytest.approx(2.0) and len(r.on) == len(r.off) == 4 for r in result.runs)
    assert [round(r.tau, 2) for r in result.runs] == [round(32 / 7, 2), round(32 / 2, 2)] * 2
    argvs = standin_server.argvs(folder)
    alone = [a for a in argvs if "-md" not in a]
    assert len(alone) == 1 and len(argvs) == 5  # the target alone once, a server per combination
    for a in argvs:
        assert a[a.index("--host") + 1] == "127.0.0.1" and "--no-repack" in a and a[a.index("-np") + 1] == "1"
    spec = [a for a in argvs if "-md" in a]
    assert [(a[a.index("-ctkd") + 1], a[a.index("-ctvd") + 1], a[a.index("--spec-draft-n-max") + 1]) for a in spec] \
        == [("f16", "f16", "4"), ("f16", "f16", "15"), ("q8_0", "q8_0", "4"), ("q8_0", "q8_0", "15")]
    assert all(a[a.index("--spec-type") + 1] == "draft-dflash" for a in spec)
    assert not any(standin_server.alive(p) for p in standin_server.pids(folder))


@pytest.mark.parametrize("mode, verdict, message", [
    ("segv", VERDICT_CRASHED, "llama-server crashed (SIGSEGV) while loading: main: loading model | load_tensors: "
                              "loading model tensors | ggml_backend_amx_buffer_set_tensor: repack fc.weight"),
    ("segv-generate", VERDICT_CRASHED, "llama-server crashed (SIGSEGV) while generating"),
    ("refuse", VERDICT_REFUSED, "llama_model_load: error loading model: missing tensor fc.weight (exit 1)"),
    ("no-draft", VERDICT_REFUSED, "generated without drafting, so the drafter was not used"),
])
def test_a_drafter_the_server_will_not_run(tmp_path: Path, mode: str, verdict: str, message: str) -> None:
    folder = standin_server.make(tmp_path / "bin", mode)
    result = _measure(folder, tmp_path)
    (run,) = result.runs
    assert result.verdicts() == [verdict] and message in run.refused
    assert run.on == [] and run.off == []
    assert not any(standin_server.alive(p) for p in standin_server.pids(folder))


def test_impossible_counts_and_a_server_error_stop_the_run(tmp_path: Path) -> None:
    folder = standin_server.make(tmp_path / "a", "impossible")
    with pytest.raises(DFlashError, match=r"llama-server reported impossible figures \(more draft tokens accepted"):
        _measure(folder, tmp_path)
    folder_b = standin_server.make(tmp_path / "b", "http-error")
    with pytest.raises(DFlashError, match=r"answered HTTP 500 to /completion: .*the draft context failed"):
        _measure(folder_b, tmp_path)
    assert not any(standin_server.alive(p) for p in standin_server.pids(folder) + standin_server.pids(folder_b))


def test_server_url_without_a_running_server(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DFlashError, match=rf"http://127.0.0.1:{port}/health: no llama-server ready there"):
        measure_serving([("d.gguf", "d.gguf", 16)], TEXTS, NAMES, server_url=f"http://127.0.0.1:{port}")
    with pytest.raises(UsageError, match="are the running server's own"):
        measure_serving([("d.gguf", "d.gguf", 16)], TEXTS, NAMES, server_url="http://127.0.0.1:1", draft_n_max=[4])
    with pytest.raises(UsageError, match="is the server of --server-url"):
        measure_serving([("d.gguf", "d.gguf", 16)], TEXTS, NAMES, server_url=f"http://127.0.0.1:{port}",
                        baseline_url=f"http://localhost:{port}/")


def _accept_child(folder: Path, tmp_path: Path, drafter_gguf: Path, extra: list[str]) -> subprocess.Popen:
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    args = [str(drafter_gguf), "--target", str(TRAINED / "target"), "--prompts", str(TRAINED / "prompts.jsonl"),
            "--max-prompts", "2", "--max-new-tokens", "8", "--llama-server", str(folder), "--target-gguf",
            str(target), "-q", "-o", str(tmp_path / "report.json"), *extra]
    code = DEFAULT_SIGNALS + f"from dflashkit.cli import accept_command\naccept_command({args!r})\n"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def drafter_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dflashkit.converters.convert import convert

    out = tmp_path_factory.mktemp("drafter") / "drafter-bf16.gguf"
    convert(TRAINED / "drafter", out, outtype="bf16", target=TRAINED / "target", progress=False, warn=lambda m: None)
    return out


def _port_free(argv: list[str]) -> bool:
    """Nothing listens on the server's port (SO_REUSEADDR: its closed connections may still sit in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", int(argv[argv.index("--port") + 1])))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("how, code", [("normal", 0), ("error", 1), ("INT", 130), ("TERM", -signal.SIGTERM),
                                       ("HUP", -signal.SIGHUP)])
def test_no_server_is_left_behind(tmp_path: Path, drafter_gguf: Path, how: str, code: int) -> None:
    mode = {"normal": "normal", "error": "http-error"}.get(how, "hang")
    folder = standin_server.make(tmp_path / "bin", mode)
    proc = _accept_child(folder, tmp_path, drafter_gguf, [])
    if mode == "hang":  # the signal arrives while dflash-accept waits on the server's reply
        deadline = time.monotonic() + HANG_SECONDS
        while not (folder / "request-arrived").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (folder / "request-arrived").exists(), proc.communicate()
        proc.send_signal(getattr(signal, f"SIG{how}"))
    rc, out, err = wait_or_kill(proc)
    assert rc == code, err
    if how == "error":
        assert err.startswith("error: llama-server (drafter-bf16.gguf) at http://127.0.0.1:") and "HTTP 500" in err
    if how == "INT":
        assert err.strip().endswith("interrupted (no output written)")
    assert "Traceback" not in err
    pids = standin_server.pids(folder)
    assert len(pids) == 2 and not any(standin_server.alive(p) for p in pids)
    assert all(_port_free(a) for a in standin_server.argvs(folder))
    assert not list(tmp_path.glob("dflashkit-llama-*"))  # the temp folder for converted GGUFs is gone
    assert (tmp_path / "report.json").exists() == (how == "normal")


def test_min_speedup_and_the_report(tmp_path: Path, drafter_gguf: Path) -> None:
    folder = standin_server.make(tmp_path / "bin")
    proc = _accept_child(folder, tmp_path, drafter_gguf, ["--min-speedup", "2.5", "--draft-cache-type", "q8_0"])
    rc, out, err = wait_or_kill(proc)
    assert rc == 1, err
    report = json.loads((tmp_path / "report.json").read_text())
    (row,) = next(s["rows"] for s in report["sections"] if s["id"] == "serving")
    assert row["verdict"] == VERDICT_GAIN and row["speedup"] == pytest.approx(2.0)
    assert row["draft_cache_type"] == "q8_0" and row["draft_n_max"] == 15 and row["identical_output"] == "yes"
    assert row["speedup_ci"] == [pytest.approx(2.0), pytest.approx(2.0)] and row["tokens_per_s_on"] > 0
    assert "speed-up ×2.00 below --min-speedup 2.5" in report["status"]
    assert report["summary"]["min_speedup"] == 2.5


# ---------------------------------------------------------------------------------------------
# The real llama-server of each pinned build
# ---------------------------------------------------------------------------------------------

BUILDS = {"0.3.36": ("DFLASHKIT_LLAMA_CPP_BIN", "DFLASHKIT_LLAMA_CPP_SRC", "DFLASHKIT_LLAMA_CPP_SKIP_REASON"),
          "b11549": ("DFLASHKIT_LLAMA_CPP_MAINLINE_BIN", "DFLASHKIT_LLAMA_CPP_MAINLINE_SRC",
                     "DFLASHKIT_LLAMA_CPP_MAINLINE_SKIP_REASON")}


def build_bin(build: str) -> Path:
    bin_var, _, reason_var = BUILDS[build]
    folder = Path(os.environ.get(bin_var, "/nonexistent"))
    if not all((folder / t).exists() for t in ("llama-server", "llama-speculative-simple")):
        pytest.skip(os.environ.get(reason_var) or f"set {bin_var} to the bin/ folder of the llama.cpp {build} build "
                    "with llama-server and llama-speculative-simple (.ci/run builds it)")
    return folder


@pytest.fixture(scope="module", params=list(BUILDS))
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One build: its bin/ folder, the trained target converted by its own converter, the bf16 drafter and the
    planted fc-zeroed copy, and eight held-out prompts rendered as text."""
    import make_target
    import make_trained_pair
    from test_trained_pair import plant_defects

    from dflashkit.converters.convert import convert
    from dflashkit.llama_cpp import target_gguf_from_hf

    build = request.param
    folder = build_bin(build)
    root = tmp_path_factory.mktemp(f"real-{build}")
    src = os.environ.get(BUILDS[build][1])
    target = root / "target.gguf"
    if src and (Path(src) / "convert_hf_to_gguf.py").is_file():
        target_gguf_from_hf(TRAINED / "target", target, Path(src))
    else:
        make_target.make_gguf_target(target, TRAINED / "target")
    bf16 = root / "drafter-bf16.gguf"
    convert(TRAINED / "drafter", bf16, outtype="bf16", target=TRAINED / "target", progress=False, warn=lambda m: None)
    planted = plant_defects(bf16, root / "planted")
    texts = [p["text"] for p in make_trained_pair.held_out_prompts(31, 8)]
    return {"build": build, "bin": folder, "target": target, "bf16": bf16, "fc_zeroed": planted["fc-zeroed"],
            "texts": texts}


def _ours(target: Path) -> list[int]:
    """Processes still running with this target file on their command line."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(target).encode() in cmdline.read_bytes():
                out.append(int(cmdline.parent.name))
        except OSError:
            pass
    return out


def test_real_server_speedup_identical_output_and_a_planted_defect(real: dict) -> None:
    texts = real["texts"]
    result = measure_serving([("bf16", real["bf16"], 16), ("fc-zeroed", real["fc_zeroed"], 16)], texts,
                             [f"p{i}" for i in range(len(texts))], llama_server=real["bin"],
                             target_ggufs=[real["target"]], max_new_tokens=48)
    good, zeroed = result.runs
    assert good.refused is None and len(good.on) == len(good.off) == len(texts)
    assert good.differences(result.prompt_names) == []  # speculative output = the target's own greedy output
    assert good.tau >= 4.0, good.taus
    lo, hi = good.speedup_ci
    assert lo <= good.speedup <= hi and math.isfinite(good.tokens_per_s_off) and good.tokens_per_s_on > 0
    assert good.verdict(result.prompt_names) in (VERDICT_GAIN, VERDICT_NO_GAIN, VERDICT_LOSS)
    assert zeroed.tau < 1.5, zeroed.taus
    assert zeroed.differences(result.prompt_names) == []
    assert zeroed.verdict(result.prompt_names) in (VERDICT_NO_GAIN, VERDICT_LOSS), (zeroed.speedup, zeroed.speedup_ci)
    assert _ours(real["target"]) == []


def test_real_server_tau_equals_speculative_simple(real: dict) -> None:
    from dflashkit.llama_cpp import run_drafter
    from dflashkit.llama_cpp.server import run_drafter_server
    from dflashkit.stats import paired_comparison

    texts = real["texts"]
    kw = dict(n_predict=48, draft_max=15)
    served = run_drafter_server(real["bin"], real["target"], "bf16", real["bf16"], texts, **kw)
    # speculative-simple's counts come from its log, which llama.cpp may lose at exit: a lost log is rerun, never
    # guessed (10 runs at most, run_prompt's rule); the server's come from its JSON
    simple = run_drafter(real["bin"] / "llama-speculative-simple", real["target"], "bf16", real["bf16"], texts,
                         retries=10, **kw)
    assert served.refused is None and simple.refused is None
    c = paired_comparison(simple.taus, served.taus)
    assert c.ci is not None and c.ci[0] <= 0 <= c.ci[1] or abs(c.relative) < 0.05, (simple.taus, served.taus)


@contextlib.contextmanager
def _started_by_hand(commands: list[list[str]], ports: list[int]) -> Iterator[list[subprocess.Popen]]:
    """llama-servers started as a user starts them from a shell (not through dflashkit), each polled on /health
    with urllib until it answers 200 (HANG_SECONDS at most), and terminated when the block ends."""
    import urllib.request

    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in commands]
    try:
        for port in ports:
            deadline = time.monotonic() + HANG_SECONDS
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                        if reply.status == 200:
                            break
                except OSError:
                    time.sleep(0.1)
        yield procs
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def test_server_url_measured_as_a_user_runs_it(real: dict, tmp_path: Path) -> None:
    from dflashkit.cli import accept_command
    from click.testing import CliRunner

    from dflashkit.llama_cpp.server import free_port

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(real["texts"][:4])))
    # the user's own servers, started from a shell as the llama.cpp docs show: the target with the drafter, and alone
    ports = free_port(), free_port()
    server = str(real["bin"] / "llama-server")
    commands = [[server, "-m", str(real["target"]), "-md", str(real["bf16"]), "--spec-type", "draft-dflash",
                 "--spec-draft-n-max", "15", "--port", str(ports[0]), "-t", "1"],
                [server, "-m", str(real["target"]), "--port", str(ports[1]), "-t", "1"]]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    with _started_by_hand(commands, ports) as procs:
        res = CliRunner().invoke(accept_command, [
            str(real["bf16"]), "--target", str(TRAINED / "target"), "--prompts", str(prompts), "--max-new-tokens",
            "32", "--server-url", urls[0], "--baseline-url", urls[1], "--json", "-q"])
        assert all(p.poll() is None for p in procs)  # dflashkit leaves a user's servers running
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    (row,) = next(s["rows"] for s in report["sections"] if s["id"] == "serving")
    assert row["target"] == urls[0] and row["identical_output"] == "yes" and row["tau"] >= 4.0
    # the server's τ against the reference on its schedule at the n-max it was started with (15: the block's)
    assert row["reference_tau_per_prompt"] == row["tau_per_prompt"] and row["tau_verdict"] == "agrees"
    assert row["verdict"] in (VERDICT_GAIN, VERDICT_NO_GAIN, VERDICT_LOSS) and len(row["speedup_ci"]) == 2
    assert _ours(real["target"]) == []


def test_server_url_at_llama_servers_default_n_max_names_the_cause(real: dict, tmp_path: Path) -> None:
    # a user starts llama-server with the drafter and no --spec-draft-n-max, as a quick start would: it drafts 3 a
    # round (n_max = 3), τ sits near 4 for a drafter whose τ is ~13 at 15 — the report says why and how to set it
    from click.testing import CliRunner

    from dflashkit.cli import accept_command
    from dflashkit.llama_cpp.server import free_port

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(real["texts"][:3])))
    port = free_port()
    command = [str(real["bin"] / "llama-server"), "-m", str(real["target"]), "-md", str(real["bf16"]),
               "--spec-type", "draft-dflash", "--port", str(port), "-t", "1"]
    with _started_by_hand([command], [port]):
        res = CliRunner().invoke(accept_command, [
            str(real["bf16"]), "--target", str(TRAINED / "target"), "--prompts", str(prompts), "--max-new-tokens",
            "32", "--server-url", f"http://127.0.0.1:{port}", "--json", "-q"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    (row,) = next(s["rows"] for s in report["sections"] if s["id"] == "serving")
    assert row["drafts_at_most"] == 3 and row["tau"] <= 4.0, row
    (note,) = next(s["items"] for s in report["sections"] if s["id"] == "serving_n_max")
    assert "every reply drafted at most 3 token(s) a round" in note and "the server's n-max is likely 3" in note
    assert "start it with --spec-draft-n-max 15" in note


def test_a_server_that_never_answers_is_timed_out(tmp_path: Path, drafter_gguf: Path) -> None:
    folder = standin_server.make(tmp_path / "bin", "hang")
    start = time.monotonic()
    proc = _accept_child(folder, tmp_path, drafter_gguf, ["--llama-cpp-timeout", "2"])
    rc, out, err = wait_or_kill(proc)
    assert rc == 1, err
    assert err.startswith("error: llama-server (drafter-bf16.gguf) at http://127.0.0.1:")
    assert err.strip().endswith("did not answer a completion in 2 s (raise --llama-cpp-timeout for a slow machine or "
                                "a big model)") and len(err.strip().splitlines()) == 1
    assert time.monotonic() - start < HANG_SECONDS  # not the default 600 s
    assert not any(standin_server.alive(p) for p in standin_server.pids(folder))


@pytest.mark.parametrize("where", ["target-gguf", "server-binary"])
def test_an_input_is_never_the_report(tmp_path: Path, drafter_gguf: Path, where: str) -> None:
    from click.testing import CliRunner

    from dflashkit.cli import accept_command

    folder = standin_server.make(tmp_path / "bin")
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF-target-bytes")
    out = target if where == "target-gguf" else folder / "llama-server"
    before = out.read_bytes()
    res = CliRunner().invoke(accept_command, [
        str(drafter_gguf), "--target", str(TRAINED / "target"), "--llama-server", str(folder), "--target-gguf",
        str(target), "-o", str(out), "--force", "-q"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: -o {out}: is also an input") and out.read_bytes() == before
    assert standin_server.pids(folder) == []  # refused before anything started


def test_term_while_speculative_simple_runs_leaves_nothing(tmp_path: Path, drafter_gguf: Path) -> None:
    # TERM unwinds like Ctrl-C: the llama.cpp child is killed, the temp folder removed, then dflash-accept dies of TERM
    folder = tmp_path / "bin"
    folder.mkdir()
    simple = folder / "llama-speculative-simple"
    simple.write_text(f"#!{sys.executable}\nimport os, time\nfrom pathlib import Path\n"
                      f"Path({str(folder / 'pid')!r}).write_text(str(os.getpid()))\ntime.sleep(3600)\n")
    simple.chmod(0o755)
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    args = [str(drafter_gguf), "--target", str(TRAINED / "target"), "--prompts", str(TRAINED / "prompts.jsonl"),
            "--max-prompts", "1", "--max-new-tokens", "8", "--llama-cpp", str(folder), "--target-gguf", str(target),
            "-q"]
    code = DEFAULT_SIGNALS + f"from dflashkit.cli import accept_command\naccept_command({args!r})\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)}, cwd=ROOT)
    deadline = time.monotonic() + HANG_SECONDS
    while not (folder / "pid").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (folder / "pid").exists(), proc.communicate()
    assert list(tmp_path.glob("dflashkit-llama-*"))
    proc.send_signal(signal.SIGTERM)
    rc, _, err = wait_or_kill(proc)
    assert rc == -signal.SIGTERM, err
    child = int((folder / "pid").read_text())
    deadline = time.monotonic() + 10
    while standin_server.alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not standin_server.alive(child)
    assert not list(tmp_path.glob("dflashkit-llama-*"))


def test_a_proxy_in_the_environment_is_not_used_for_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there: a proxied request would fail
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    result = _measure(standin_server.make(tmp_path / "bin"), tmp_path)
    assert result.verdicts() == [VERDICT_GAIN]


def test_a_crash_of_the_target_alone_is_not_the_drafters(tmp_path: Path) -> None:
    """The shared target alone dies: every combination of its target is left without a figure and says why (the
    verdict crashed, the gate fails), and the rest of the run is kept."""
    folder = standin_server.make(tmp_path / "bin", "base-segv-generate")
    result = _measure(folder, tmp_path)
    assert result.verdicts() == [VERDICT_CRASHED]
    (run,) = result.runs
    assert run.crashed and run.on == [] and run.off == []
    assert run.refused == (f"the target alone (llama-server (target alone)) failed: {tmp_path / 'target.gguf'}: "
                           "llama-server crashed (SIGSEGV) while generating: main: loading model")
    assert result.failures(0.5) == [f"d.gguf on target.gguf (draft cache default, n-max 15): llama-server crashed: "
                                    f"{run.refused}"]
    assert not any(standin_server.alive(p) for p in standin_server.pids(folder))


@pytest.mark.parametrize("extra, code, message", [
    (["--server-url", "http://127.0.0.1:1", "--draft-n-max", "4"], 2, "--draft-n-max / --draft-cache-type are set"),
    (["--server-url", "ftp://x"], 1, "--server-url ftp://x: give an http:// or https:// URL"),
    (["--server-url", "http://127.0.0.1:8x"], 1, "http://127.0.0.1:8x/health: no llama-server ready there"),
    (["--server-url", "http://127.0.0.1:1", "--llama-cpp-arg=--no-repack"], 2, "--llama-cpp-arg goes to the llama.cpp"),
    (["--llama-server", "{bin}", "--target-gguf", "{target}", "--max-new-tokens", "2"], 2, "give at least 3"),
])
def test_serving_options_are_checked_before_the_reference_runs(tmp_path: Path, extra: list[str], code: int,
                                                               message: str) -> None:
    from click.testing import CliRunner

    from dflashkit.cli import accept_command

    folder = standin_server.make(tmp_path / "bin")
    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF")
    args = [a.format(bin=folder, target=target) for a in extra]
    start = time.monotonic()
    res = CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"), *args,
                                              "-q"])
    assert res.exit_code == code and message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert "Traceback" not in res.output and "internal error" not in res.output
    assert time.monotonic() - start < 20  # no reference run (the target is not even loaded)


def test_term_in_a_nested_unwind_lets_the_outer_clean_up(tmp_path: Path) -> None:
    code = DEFAULT_SIGNALS + f"""
import os, signal, tempfile
from pathlib import Path
from dflashkit.files import signals_unwind
with signals_unwind(), tempfile.TemporaryDirectory(dir={str(tmp_path)!r}) as d:
    Path(d, "big.gguf").write_bytes(b"x")
    with signals_unwind():  # as convert's atomic writer inside dflash-accept's llama.cpp folder
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rc, _, err = wait_or_kill(proc)
    assert rc == -signal.SIGTERM, err
    assert list(tmp_path.iterdir()) == []
