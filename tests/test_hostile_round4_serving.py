"""Issue 39, the serving clients: dflash-accept against a hostile llama-server (`hostile_http`), run as a user runs
it (`contained`): a figure only from a possible reply — refused with its numbers, never corrected —, no redirect
followed, every exchange under one deadline, replies parsed under bounds, and the reserved llama.cpp arguments
refused by what they do. Each case: exit code, one ``error:`` line, inputs unchanged, nothing left running or in
the temp folder, under the memory cap, and — where a loop was the defect — an end within the documented bound."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import standin_server
from contained import check_contained, run_contained
from hostile_http import HostileServer, completion_reply
from test_hostile_round3 import accept_args, pair  # noqa: F401  (pair: a fixture)

pytestmark = pytest.mark.slow  # every test runs dflash-accept as a child

TIMEOUT = 5  # --llama-cpp-timeout of the bounded cases
#: what the bound may be exceeded by: a busy machine's scheduling, never a second exchange
SLACK_S = 10.0


def _accept(tmp_path: Path, pair: dict, *extra: object, new_tokens: int = 8):  # type: ignore[no-untyped-def]
    args = accept_args(pair, "--max-prompts", "1", "--llama-cpp-timeout", TIMEOUT, *extra)
    args[args.index("--max-new-tokens") + 1] = str(new_tokens)
    return run_contained("accept_command", args, inputs=[pair["target"], pair["prompts"]], tmp=tmp_path / "tmp")


@pytest.mark.parametrize("case, reply, new_tokens, message", [
    ("a time of 1e-300 ms", completion_reply(8, draft=True, predicted_ms=1e-300), 8,
     "predicted_ms 1e-300 for 7 decoded tokens: under 1 µs a token"),
    ("a time of 0", completion_reply(8, draft=True, predicted_ms=0), 8, "predicted_ms 0 for 7 decoded tokens"),
    ("τ 63 for a block-16 drafter",  # the warm-up's 8 tokens pass; the 64 of the measurement cannot
     lambda n: completion_reply(n, draft=True, draft_n=n - 2, draft_n_accepted=n - 2), 64,
     "62 draft tokens in at most 1 round(s) of at most 15"),
    ("10^30 tokens drafted", completion_reply(8, draft=True, draft_n=10**30), 8,
     f"{10**30} draft tokens in at most"),
    ("80 tokens for n_predict 8", completion_reply(80, draft=True), 8, "predicted_n 80 for a request of n_predict 8"),
    ("a token outside the vocabulary", {**completion_reply(8, draft=True), "tokens": [7] * 7 + [10**9]}, 8,
     "token id 1000000000 outside the target's vocabulary of"),
    ("a time longer than the reply took", completion_reply(8, draft=True, predicted_ms=4e6), 8,
     "predicted_ms 4e+06 for a reply that took"),
])
def test_an_impossible_reply_is_refused_with_its_numbers(tmp_path: Path, pair: dict, case: str, reply: object,
                                                         new_tokens: int, message: str) -> None:
    with HostileServer(reply=reply) as server:
        run = _accept(tmp_path, pair, "--server-url", server.url, new_tokens=new_tokens)
    check_contained(run, 1, message, bounded=True)
    assert "refused, not reported" in run.lines()[0]


def test_a_baseline_that_is_the_server_itself_is_a_usage_error(tmp_path: Path, pair: dict) -> None:
    with HostileServer() as server:
        other_spelling = server.url.replace("127.0.0.1", "localhost")
        run = _accept(tmp_path, pair, "--server-url", server.url, "--baseline-url", other_spelling)
    check_contained(run, 2, f"--baseline-url {other_spelling} is the server of --server-url {server.url}")
    assert server.hits.get("/completion", 0) == 0  # said before any measurement


def test_a_baseline_that_drafts_is_not_the_target_alone(tmp_path: Path, pair: dict) -> None:
    with HostileServer() as spec, HostileServer(draft=True) as base:
        run = _accept(tmp_path, pair, "--server-url", spec.url, "--baseline-url", base.url)
    check_contained(run, 1, "llama-server reported impossible figures (draft counts (draft_n 15) from a server that "
                            "runs no drafter)", bounded=True)
    assert run.lines()[0].startswith(f"error: target alone {base.url}: ")


@pytest.mark.parametrize("where", ["another port", "a non-loopback address"])
def test_a_redirect_is_refused_not_followed(tmp_path: Path, pair: dict, where: str) -> None:
    with HostileServer() as elsewhere:
        location = f"{elsewhere.url}/completion" if where == "another port" else "http://192.0.2.1:80/completion"
        with HostileServer("redirect", location=location) as server:
            run = _accept(tmp_path, pair, "--server-url", server.url)
        check_contained(run, 1, f"with a redirect (HTTP 301 to {location}): redirects are not followed", bounded=True)
        assert elsewhere.hits == {}


@pytest.mark.parametrize("mode", ["trickle-headers", "continue-flood", "trickle-body"])
def test_a_trickling_server_is_bounded_by_one_deadline(tmp_path: Path, pair: dict, mode: str) -> None:
    with HostileServer(mode) as server:
        started = time.monotonic()
        run = _accept(tmp_path, pair, "--server-url", server.url)
        ended = started + run.elapsed_s
    check_contained(run, 1, f"did not answer a completion in {TIMEOUT} s", bounded=True)
    asked = server.first_completion_at
    assert asked is not None and ended - asked < TIMEOUT + SLACK_S, f"{ended - asked:.1f} s after the request"


def test_a_trickled_health_is_bounded(tmp_path: Path, pair: dict) -> None:
    with HostileServer("health-trickle") as server:
        run = _accept(tmp_path, pair, "--server-url", server.url)
    check_contained(run, 1, f"{server.url}/health: no llama-server ready there (no answer in {TIMEOUT} s)",
                    bounded=True)
    assert run.elapsed_s < TIMEOUT + 60  # the health check comes first: start-up, then one bounded exchange


@pytest.mark.parametrize("mode, message", [
    ("huge", "objects/arrays, over the 10000 any completion reply has"),
    ("huge-announced", "announced, over 16 MiB — refused unread"),
    ("strings", "the server's reply"),  # parsed under the 16 MiB bound: its peak stays far below the cap
])
def test_a_reply_of_megabytes_of_small_values_is_refused_under_the_cap(tmp_path: Path, pair: dict, mode: str,
                                                                        message: str) -> None:
    with HostileServer(mode) as server:
        run = _accept(tmp_path, pair, "--server-url", server.url)
    check_contained(run, 1, message, bounded=True)


def test_a_short_body_is_not_a_reply(tmp_path: Path, pair: dict) -> None:
    with HostileServer("short-body") as server:
        run = _accept(tmp_path, pair, "--server-url", server.url)
    check_contained(run, 1, "the reply ended", bounded=True)
    assert "short of its Content-Length" in run.lines()[0]


def test_a_draft_n_max_above_the_block_is_a_usage_error(tmp_path: Path, pair: dict) -> None:
    folder = standin_server.make(tmp_path / "bin")
    run = run_contained("accept_command", accept_args(pair, "--llama-server", folder, "--target-gguf",
                                                      pair["target_gguf"], "--draft-n-max", "200"),
                        inputs=[pair["target"], pair["prompts"]], tmp=tmp_path / "tmp", pid_folder=folder)
    check_contained(run, 2, "--draft-n-max 200: drafter drafts at most 15 tokens a round (block size 16")
    assert standin_server.pids(folder) == []  # refused before any server started


def test_a_server_whose_grandchild_leaves_its_group_does_not_hold_the_run(tmp_path: Path, pair: dict) -> None:
    folder = standin_server.make(tmp_path / "bin", "setsid-grandchild")
    run = run_contained("accept_command", accept_args(pair, "--llama-server", folder, "--target-gguf",
                                                      pair["target_gguf"], "--max-prompts", "1"),
                        inputs=[pair["target"], pair["prompts"]], tmp=tmp_path / "tmp", pid_folder=folder)
    try:
        check_contained(run, 0, bounded=True)
        assert run.elapsed_s < 60, f"ran {run.elapsed_s:.0f} s: stop() waited for the escaped grandchild"
    finally:
        standin_server.kill_escaped(folder)


@pytest.mark.parametrize("arg", ["--llama-cpp-arg=--fim-qwen-7b-spec", "--llama-cpp-arg=-dr",
                                 "--llama-cpp-arg=--embd-gemma-default", "--llama-cpp-arg=-hfd"])
def test_a_preset_or_alias_that_loads_a_model_is_refused(tmp_path: Path, pair: dict, arg: str) -> None:
    folder = standin_server.make(tmp_path / "bin")
    run = run_contained("accept_command", accept_args(pair, "--llama-server", folder, "--target-gguf",
                                                      pair["target_gguf"], arg),
                        inputs=[pair["target"], pair["prompts"]], tmp=tmp_path / "tmp", pid_folder=folder)
    check_contained(run, 2, "loads a model — dflashkit sets the models")


# --- the second attacker's pass --------------------------------------------------------------------------------


def test_an_early_end_cannot_carry_more_drafts_than_its_rounds(tmp_path: Path, pair: dict) -> None:
    reply = {**completion_reply(8, draft=True, draft_n=330, draft_n_accepted=0), "stop_type": "eos"}
    with HostileServer(reply=reply) as server:
        run = _accept(tmp_path, pair, "--server-url", server.url)
    check_contained(run, 1, "330 draft tokens in at most 7 round(s) of at most 15", bounded=True)


@pytest.mark.parametrize("spelling", ["0.0.0.0", "[::ffff:127.0.0.1]"])
def test_a_baseline_spelled_as_every_address_is_the_same_server(tmp_path: Path, pair: dict, spelling: str) -> None:
    with HostileServer() as server:
        other = server.url.replace("127.0.0.1", spelling)
        run = _accept(tmp_path, pair, "--server-url", server.url, "--baseline-url", other)
    check_contained(run, 2, "is the server of --server-url")


def test_a_host_no_resolver_takes_is_one_line(tmp_path: Path, pair: dict) -> None:
    with HostileServer() as server:
        port = server.url.rsplit(":", 1)[1]
        run = _accept(tmp_path, pair, "--server-url", server.url, "--baseline-url", f"http://a..b:{port}/base")
    assert run.returncode == 1 and len(run.lines()) == 1 and "internal error" not in run.stderr, run.stderr


def test_credentials_in_a_url_are_never_recorded(tmp_path: Path, pair: dict) -> None:
    with HostileServer() as server:
        url = server.url.replace("http://", "http://user:s3cretpw@")
        args = accept_args(pair, "--max-prompts", "1", "--server-url", url, "-o", tmp_path / "report.json")
        run = run_contained("accept_command", args, inputs=[pair["target"], pair["prompts"]], tmp=tmp_path / "tmp")
    check_contained(run, 0)
    assert "s3cretpw" not in (tmp_path / "report.json").read_text() + run.stderr + run.stdout
