"""``--parallel``: llama-server with -np N asked N prompts at once — identical output per request, τ per slot (a slot
that drafts nothing named as the forks' bug), aggregate speed-up with its CI. The stand-in llama-server
(tests/standin_server.py) serves N requests at once in N slots; the real builds are in test_context_long_pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import standin_server
from dflashkit.accept import run_acceptance
from dflashkit.accept.options import LlamaCppOptions
from dflashkit.accept.parallel import Batch, ParallelLevel, batches_of, measure_parallel
from dflashkit.cli import accept_command
from dflashkit.errors import UsageError
from dflashkit.llama_cpp.server import Completion

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
TEXTS = ["one two", "three four", "five six", "seven eight", "nine ten"]


def _level(folder: Path, tmp_path: Path, levels: list[int]) -> list[ParallelLevel]:
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    return measure_parallel(folder, target, ("d.gguf", tmp_path / "d.gguf", 16), TEXTS, levels, max_new_tokens=33,
                            ctx_per_request=300, threads=1, extra_args=[], timeout=60, vocab=None, seed=0,
                            ignore_eos=False, progress=lambda m: None)


def test_batches_are_full_and_wrap_around() -> None:
    assert batches_of(5, 2) == [[0, 1], [2, 3], [4, 0]]
    assert batches_of(5, 4) == [[0, 1, 2, 3], [4, 0, 1, 2]]
    assert batches_of(3, 1) == [[0], [1], [2]]


def test_each_level_starts_its_servers_with_np_and_asks_n_at_once(tmp_path: Path) -> None:
    # 10 ms a token (a request 0.32 s with the drafter, 0.64 s alone): the stand-in's sleeps, not its HTTP and thread
    # overhead, set the speed-up, also while other jobs keep both cores busy (at 3 ms it read 1.4× then)
    folder = standin_server.make(tmp_path / "bin", ms_per_token=10.0)
    lv1, lv2, lv4 = _level(folder, tmp_path, [1, 2, 4])
    argvs = standin_server.argvs(folder)
    assert sorted((a[a.index("-np") + 1], a[a.index("-c") + 1], "-md" in a) for a in argvs) == [
        ("1", "300", False), ("1", "300", True), ("2", "600", False), ("2", "600", True), ("4", "1200", False),
        ("4", "1200", True)]
    assert [len(lv.on) for lv in (lv1, lv2, lv4)] == [5, 3, 2]
    assert {c.slot for b in lv4.on for c in b.replies} == {0, 1, 2, 3}  # four requests in flight: four slots
    for lv in (lv1, lv2, lv4):
        assert lv.differences(TEXTS) == [] and lv.slot_findings() == []
        assert lv.speedup == pytest.approx(2.0, rel=0.25) and lv.verdict(TEXTS) == "net gain"
    assert not any(standin_server.alive(p) for p in standin_server.pids(folder))


def test_a_slot_that_drafts_nothing_is_named(tmp_path: Path) -> None:
    folder = standin_server.make(tmp_path / "bin", "slot1-nodraft")
    (lv,) = _level(folder, tmp_path, [2])
    taus = lv.slot_taus()
    assert taus[0] == pytest.approx(32 / 2) and taus[1] == pytest.approx(1.0)
    assert lv.slot_findings() == ["slot 1 drafts nothing that is accepted (τ 1.00; slot 0 τ 16.00) — a server that "
                                  "drafts slots past 0 from slot 0's state (the forks' bug)"]


def _completion(tokens: list[int], slot: int, accepted: int = 0, ms: float = 10.0) -> Completion:
    return Completion(tokens=tokens, predicted_n=len(tokens), predicted_ms=ms, draft_n=15 * 4, draft_accepted=accepted,
                      prompt_n=5, speculated=True, slot=slot)


def test_a_request_whose_output_differs_is_named_with_its_slot() -> None:
    alone = Batch([0, 1], 1.0, [_completion([1, 2, 3], 0), _completion([4, 5, 6], 1)])
    on = Batch([0, 1], 0.5, [_completion([1, 2, 3], 0, 1), _completion([4, 9, 6], 1, 1)])
    lv = ParallelLevel("d.gguf", 2, on=[on], off=[alone])
    assert lv.differences(["p0", "p1"]) == ["batch 1, prompt p1 (slot 1): differs from the target alone at token 1"]
    assert lv.verdict(["p0", "p1"]) == "output differs"
    assert lv.aggregate(lv.on) == pytest.approx(4 / 0.5) and lv.speedup == pytest.approx(2.0)


def test_slot_much_below_slot_0() -> None:
    # slot 0: 2 decoded tokens in 1 round each (τ 3); slot 1: τ 1.4
    a = Completion(tokens=[1] * 13, predicted_n=13, predicted_ms=5, draft_n=60, draft_accepted=8, prompt_n=3,
                   speculated=True, slot=0)
    b = Completion(tokens=[1] * 13, predicted_n=13, predicted_ms=5, draft_n=60, draft_accepted=3, prompt_n=3,
                   speculated=True, slot=1)
    lv = ParallelLevel("d", 2, on=[Batch([0, 1], 1.0, [a, b])])
    t = lv.slot_taus()
    assert t[1] - 1 < 0.5 * (t[0] - 1)
    assert lv.slot_findings() == [f"slot 1 drafts much less than slot 0 (τ {t[1]:.2f} against {t[0]:.2f})"]


def test_slots_are_counted_against_their_prompts_alone() -> None:
    # the server chose which prompts each slot got: slot 1 got prompts that accept little one at a time too
    def reply(accepted: int, slot: int) -> Completion:
        return Completion(tokens=[1] * 13, predicted_n=13, predicted_ms=5, draft_n=60, draft_accepted=accepted,
                          prompt_n=3, speculated=True, slot=slot)

    batch = Batch([0, 1], 1.0, [reply(8, 0), reply(3, 1)])  # slot 0 τ 12/4 = 3, slot 1 τ 12/9 ≈ 1.33
    hard_prompt = ParallelLevel("d", 2, on=[batch], alone_taus=[3.0, 1.4])
    assert hard_prompt.slot_findings() == []
    drafts_less = ParallelLevel("d", 2, on=[batch], alone_taus=[3.0, 3.0])
    assert drafts_less.slot_findings() == ["slot 1 drafts much less than slot 0 (τ 1.33 against 3.00; the same "
                                           "prompts one at a time: τ 3.00 and 3.00)"]
    nothing = ParallelLevel("d", 2, on=[Batch([0, 1], 1.0, [reply(8, 0), reply(0, 1)])], alone_taus=[3.0, 1.4])
    assert nothing.slot_findings()[0].startswith("slot 1 drafts nothing that is accepted (τ 1.00; slot 0 τ 3.00)")


def test_parallel_needs_llama_server() -> None:
    res = CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"),
                                              "--parallel", "1,2"])
    assert res.exit_code == 2 and res.stderr.strip() == (
        "error: --parallel starts llama-server with -np N for each level: pass --llama-server BIN_DIR")
    with pytest.raises(UsageError, match="--parallel starts llama-server"):
        run_acceptance(TRAINED / "target", [TRAINED / "drafter"], parallel=[2])
    for bad in ("0", "65", "1,1"):
        res = CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"),
                                                  "--llama-server", "x", "--parallel", bad])
        assert res.exit_code == 2 and res.stderr.startswith(f"error: --parallel {bad.split(',')[-1]}")


def test_accept_reports_by_concurrent_requests(tmp_path: Path) -> None:
    from dflashkit.converters.convert import convert

    folder = standin_server.make(tmp_path / "bin", "slot1-nodraft", ms_per_token=3.0)
    gguf = tmp_path / "drafter.gguf"
    convert(TRAINED / "drafter", gguf, outtype="bf16", target=TRAINED / "target", progress=False, warn=lambda m: None)
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    result = run_acceptance(TRAINED / "target", [gguf], TRAINED / "prompts.jsonl", max_prompts=4, max_new_tokens=16,
                            llama=LlamaCppOptions(llama_servers=(str(folder),), target_ggufs=(str(target),),
                                                  parallel=(1, 2)))
    report = json.loads(result.report().render("json"))
    rows = next(s for s in report["sections"] if s["id"] == "by_parallel")["rows"]
    assert [(r["np"], r["batches"], r["verdict"]) for r in rows] == [(1, 4, "net gain"), (2, 2, "net gain")]
    assert rows[1]["slot_tau"] == {"0": pytest.approx(15 / 1), "1": pytest.approx(1.0)}
    assert "drafter.gguf at -np 2: slot 1 drafts nothing that is accepted" in report["status"]


def test_a_draft_context_smaller_than_the_prompt_is_named(tmp_path: Path) -> None:
    """A fork's -cd (the pinned builds have none: their draft context is -c): past it the stand-in drafts nothing."""
    from dflashkit.converters.convert import convert

    folder = standin_server.make(tmp_path / "bin")
    gguf = tmp_path / "drafter.gguf"
    convert(TRAINED / "drafter", gguf, outtype="bf16", target=TRAINED / "target", progress=False, warn=lambda m: None)
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    result = run_acceptance(TRAINED / "target", [gguf], TRAINED / "prompts.jsonl", max_prompts=8, max_new_tokens=16,
                            context=(0, 100), llama=LlamaCppOptions(llama_servers=(str(folder),),
                                                                    target_ggufs=(str(target),),
                                                                    extra_args=("-cd", "60")))
    status = result.report().status
    assert "drafter.gguf (llama-server τ): τ falls from" in status and "from --context 100" in status
    assert "the server's draft context -cd 60 is smaller than the prompt + new tokens" in status
