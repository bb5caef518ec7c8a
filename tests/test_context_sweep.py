"""``--context``: levels parsed and bounded once for every command, long context built from a documented source,
τ measured per level with one prefill per prompt and level, the cliff located and its cause named, τ by category.

The trained pair (``fixtures/trained/``, trained on 128-token sequences) is the real thing here: its τ falls past its
training length, which no short prompt shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from dflashkit.accept import run_acceptance
from dflashkit.accept.context import LongContext, check_levels_fit, read_context_file
from dflashkit.accept.prompts import Prompt, load_prompts
from dflashkit.accept.sweep import ContextSweep, DrafterLimits, cliffs, likely_causes
from dflashkit.cli import accept_command, parity_command
from dflashkit.errors import DFlashError, UsageError
from dflashkit.runtime import HFTarget
from dflashkit.sweeps import level_label, parse_context_levels, parse_parallel_levels

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- levels ---------------------------------------------------------------------------------------------------


def test_levels_parse_sorted_with_k() -> None:
    assert parse_context_levels("4k, 0,512") == (0, 512, 4096)
    assert parse_context_levels("1K") == (1024,)
    assert parse_parallel_levels("4,1,2") == (1, 2, 4)
    assert level_label(4096) == "4k" and level_label(1536) == "1536" and level_label(0) == "0"


@pytest.mark.parametrize("text, message", [
    ("", "give a list of counts"),
    ("1x", "'1x': not a count"),
    ("-5", "'-5': not a count"),
    ("1.5k", "'1.5k': not a count"),
    ("2000000", "2000000: must be 0..1,048,576"),
    ("1025k", "1025k: must be 0..1,048,576"),
    ("1k,1024", "1024: given twice"),
    ("0,,4", "'': not a count"),
    (",".join(str(i) for i in range(17)), "at most 16 levels"),
    ("9" * 40, "not a count"),
])
def test_bad_context_levels_are_usage_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=None) as exc:
        parse_context_levels(text)
    assert message in str(exc.value) and str(exc.value).startswith("--context")


@pytest.mark.parametrize("text, message", [("0", "must be 1..64"), ("65", "must be 1..64"), ("2k", "not a count"),
                                           ("1,2,3,4,5,6,7,8,9", "at most 8 levels")])
def test_bad_parallel_levels_are_usage_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse_parallel_levels(text)
    assert message in str(exc.value) and str(exc.value).startswith("--parallel")


@pytest.mark.parametrize("command", [accept_command, parity_command])
@pytest.mark.parametrize("value, message", [("1x", "--context '1x': not a count — give whole numbers (4k = 4096) separated by commas"),
                                            ("5000000", "--context 5000000: must be 0..1,048,576")])
def test_every_command_refuses_a_bad_level_in_one_line(command: Any, value: str, message: str) -> None:
    args = ([str(TRAINED / "drafter"), "--target", str(TRAINED / "target")] if command is accept_command else
            [str(TRAINED / "drafter"), str(TRAINED / "drafter")])
    res = CliRunner().invoke(command, [*args, "--context", value])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == f"error: {message}"


def test_context_file_alone_is_a_usage_error() -> None:
    res = CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"),
                                              "--context-file", "x.txt"])
    assert res.exit_code == 2 and "--context-file is the source of --context" in res.stderr


# ---- the long context -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(TRAINED / "target"))


def test_context_from_the_other_prompts_never_the_prompt_itself(tokenizer: Any) -> None:
    prompts = [Prompt(f"p{i}", text=f"the {word} walks home.") for i, word in enumerate(("king", "fox", "owl"))]
    long = LongContext(tokenizer, prompts)
    ids = long.context_ids(0, 6)
    assert len(ids) == 6
    text = tokenizer.decode(long.context_ids(0, 12))
    assert "fox" in text and "owl" in text and "king" not in text
    at = long.prompts_at(6)
    assert [p.id for p in at] == ["p0", "p1", "p2"]
    assert at[0].text.endswith(" the king walks home.") and at[0].text != prompts[0].text
    assert long.prompts_at(0) == prompts
    with pytest.raises(DFlashError) as exc:  # two short prompts hold fewer than 500 tokens: never repeated
        long.context_ids(1, 500)
    assert "the other prompts hold only" in str(exc.value) and "for prompt p1" in str(exc.value)
    assert "--context-file" in str(exc.value)


def test_chat_prompts_get_the_context_in_their_first_user_message(tokenizer: Any) -> None:
    prompts = [Prompt("a", messages=(("system", "be brief"), ("user", "hello"))), Prompt("b", text="one two three four")]
    at = LongContext(tokenizer, prompts).prompts_at(3)
    assert at[0].messages[0] == ("system", "be brief")
    assert at[0].messages[1][1].endswith("\n\nhello") and len(at[0].messages[1][1]) > len("\n\nhello")


def test_context_file_stretches_per_prompt(tokenizer: Any, tmp_path: Path) -> None:
    words = " ".join(f"w{i}" for i in range(400))
    path = tmp_path / "ctx.txt"
    path.write_text(words, encoding="utf-8")
    prompts = [Prompt(f"p{i}", text="x") for i in range(4)]
    long = LongContext(tokenizer, prompts, read_context_file(path), "ctx.txt")
    all_ids = tokenizer.encode(words, add_special_tokens=False)
    slices = [long.context_ids(i, 50) for i in range(4)]
    starts = [next(s for s in range(len(all_ids)) if all_ids[s: s + 50] == ids) for ids in slices]
    assert starts[0] == 0 and starts == sorted(starts) and len(set(starts)) == 4  # a stretch of the file each
    assert starts[-1] + 50 <= len(all_ids) and starts[-1] >= (len(all_ids) - 50) // 2
    with pytest.raises(DFlashError, match=r"context file ctx.txt holds [\d,]+ tokens"):
        long.context_ids(0, len(all_ids) + 1)


@pytest.mark.parametrize("content, message", [
    (b"", "the context file is empty"),
    (b"  \n", "the context file is empty"),
    (b"abc\xff", "not UTF-8 text (byte 0xff at offset 3)"),
    (b"abc\x00def", "holds a NUL byte (offset 3)"),
])
def test_bad_context_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "c.txt"
    path.write_bytes(content)
    with pytest.raises(DFlashError) as exc:
        read_context_file(path)
    assert message in str(exc.value) and str(path) in str(exc.value)


def test_missing_and_directory_context_files(tmp_path: Path) -> None:
    with pytest.raises(DFlashError, match="no such context file"):
        read_context_file(tmp_path / "nope.txt")
    with pytest.raises(DFlashError, match="is a directory"):
        read_context_file(tmp_path)


def test_levels_past_the_targets_context_are_refused_before_any_round() -> None:
    check_levels_fit([0, 3000], 4096, 40, 128, "target t")
    with pytest.raises(UsageError) as exc:
        check_levels_fit([0, 4000], 4096, 40, 128, "target t")
    assert str(exc.value) == ("--context 4000: 4,000 + 40 prompt tokens + 128 new tokens exceed target t's context of "
                              "4,096 (max_position_embeddings) — give levels up to 3,928")


# ---- the sweep on the trained pair ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target() -> HFTarget:
    return HFTarget(TRAINED / "target")


@pytest.fixture(scope="module")
def sweep(target: HFTarget) -> Any:
    prompts = load_prompts(TRAINED / "prompts.jsonl")[:8]
    prompts = [Prompt(p.id, "even" if i % 2 == 0 else "odd", text=p.text) for i, p in enumerate(prompts)]
    return run_acceptance(target, [TRAINED / "drafter", TRAINED / "drafter"], prompts, max_new_tokens=32,
                          context=(0, 160))


def test_one_prefill_per_prompt_and_level_for_every_drafter(sweep: Any) -> None:
    s = sweep.by_context
    assert s.levels == [0, 160] and s.prefills == [8, 8]  # two drafters, eight prompts: eight prefills a level
    assert sweep is s.results[0]
    for res in s.results:  # the kept prefill gives the very same run
        a, b = res.drafters
        assert [r.output_ids for r in a.runs] == [r.output_ids for r in b.runs]
        assert [r.accepted for r in a.runs] == [r.accepted for r in b.runs]


def test_outputs_at_long_context_are_the_targets_greedy_output(sweep: Any, target: HFTarget) -> None:
    import torch

    res = sweep.by_context.results[1]
    for ids, run in list(zip(res.prompt_ids, res.drafters[1].runs))[:3]:
        with torch.no_grad():
            out = target.model.generate(torch.tensor([ids]), max_new_tokens=len(run.output_ids), do_sample=False,
                                        eos_token_id=None)
        assert out[0, len(ids):].tolist() == run.output_ids


def test_each_prompt_is_measured_after_the_level(sweep: Any) -> None:
    short, long = sweep.by_context.results
    for a, b in zip(short.prompt_ids, long.prompt_ids):
        assert 158 <= len(b) - len(a) <= 162  # 160 tokens, give or take a merge at the seam
        assert b[-(len(a) - 4):] == a[4:]  # the prompt itself (its first word now follows a space)


def test_the_cliff_past_the_training_length_is_located(sweep: Any) -> None:
    """Trained on 128-token sequences: at ≈ 190 tokens τ falls far, and nothing this run can check explains it."""
    found = cliffs(sweep.by_context, seed=0)
    assert [(Path(c.drafter).name, c.runtime, c.level) for c in found] == [("drafter", "reference", 160)] * 2
    c = found[0]
    assert c.after < 0.75 * c.before and c.comparison.ci[1] < 0
    assert c.causes[0].startswith("none this run can check")
    report = sweep.report()
    assert "falls from" in report.status and "from --context 160" in report.status
    data = json.loads(report.render("json"))
    rows = next(s for s in data["sections"] if s["id"] == "by_context")["rows"]
    assert [r["context"] for r in rows] == [0, 160, 0, 160]
    assert rows[1]["prompt_tokens"] > rows[0]["prompt_tokens"] + 150
    assert rows[0]["prefills"] == 8


def test_tau_by_category(sweep: Any) -> None:
    data = json.loads(sweep.report().render("json"))
    rows = next(s for s in data["sections"] if s["id"] == "by_category")["rows"]
    assert [(r["category"], r["prompts"]) for r in rows[:2]] == [("even", 4), ("odd", 4)]
    d = sweep.drafters[0]
    assert rows[0]["tau"] == pytest.approx(sum(d.runs[i].tau for i in (0, 2, 4, 6)) / 4)
    assert rows[1]["tau"] == pytest.approx(sum(d.runs[i].tau for i in (1, 3, 5, 7)) / 4)
    assert rows[0]["tau_ci"][0] <= rows[0]["tau"] <= rows[0]["tau_ci"][1]


def test_the_status_says_the_prompt_length(sweep: Any) -> None:
    tokens = sum(len(i) for i in sweep.prompt_ids) / len(sweep.prompt_ids)
    plain = run_acceptance(HFTarget(TRAINED / "target"), [TRAINED / "drafter"], load_prompts(TRAINED / "prompts.jsonl")[:2],
                           max_new_tokens=8)
    n = sum(len(i) for i in plain.prompt_ids) / 2
    assert plain.report().status.startswith(f"at ≈ {n:.0f} prompt tokens: drafter τ")
    assert f"at ≈ {tokens:.0f} prompt tokens (--context 0;" in sweep.report().render("text")


# ---- causes ---------------------------------------------------------------------------------------------------


class _Res:
    def __init__(self, tokens: int, cache: str | None = None) -> None:
        self.prompt_ids, self.max_new_tokens = [[0] * tokens], 64
        self.serving = type("S", (), {"runs": [type("R", (), {"draft_cache_type": cache})()]})() if cache else None


def _sweep(limits: DrafterLimits, args: list[str] = (), target_context: int | None = None,
           cache: str | None = None) -> ContextSweep:
    return ContextSweep([0, 1000], [_Res(100), _Res(1100, cache)], "x", [limits], target_context, list(args))


def test_the_causes_it_can_check_are_named() -> None:
    window = DrafterLimits(512, (0, 1, 2), 1024, None)
    causes = likely_causes(_sweep(window), 0, 1, "reference")  # 164 → 1,164 tokens: the fall crosses the window
    assert causes[0].startswith("the drafter's sliding window of 512 tokens (layers 0, 1, 2 slide)")
    # a window the shorter level had already passed is not where the fall comes from
    assert not any("sliding window" in c for c in likely_causes(_sweep(DrafterLimits(128, (0,), 1024, None)), 0, 1,
                                                                 "reference"))
    assert causes[1] == ("past the drafter's trained length: it claims 1,024 positions (max_position_embeddings), "
                         "this level reaches 1,164 without rope scaling")
    plain = DrafterLimits(None, (), 4096, "rope_type=yarn, factor=4.0")
    server = likely_causes(_sweep(plain, ["-cd", "512", "--ctx-size=8192"], 32768, "q4_0"), 0, 1, "llama-server τ")
    assert server[0].startswith("the server's draft context -cd 512 is smaller than the prompt + new tokens (1,164)")
    assert server[1].startswith("a quantized draft KV cache (q4_0)")
    assert len(server) == 2
    # the reference runtime has no server: -cd is not its cause
    none = likely_causes(_sweep(plain, ["-cd", "512"]), 0, 1, "reference")
    assert none[0].startswith("none this run can check")
    assert likely_causes(_sweep(plain, [], 1000), 0, 1, "reference") == ["past the target's context of 1,000"]


# ---- parity by context ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra, message", [
    (["--dump", "x.npz"], "--dump writes one run's tensors: give it without --context"),
    (["--context-file", "x.txt"], "--context-file is text for an HF --target's tokenizer; with a GGUF target or none "
                                  "the context is random hidden states (drop --context-file)"),
])
def test_parity_context_usage_errors(extra: list[str], message: str) -> None:
    res = CliRunner().invoke(parity_command, [str(TRAINED / "drafter"), str(TRAINED / "drafter"), "--context", "0,64",
                                              *extra])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == f"error: {message}"


def test_parity_random_context_is_bounded_before_it_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    import dflashkit.parity.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "MAX_CONTEXT_STATE_BYTES", 1 << 20)
    with pytest.raises(UsageError) as exc:
        sweep_module.run_parity_by_context(TRAINED / "drafter", TRAINED / "drafter", levels=(0, 1024))
    # 2 taps × 256 + 2 drafters × (256 + 2 layers × K/V × 2 heads × 64): 2,048 floats a position
    assert str(exc.value) == ("--context 1k: 1,041 context positions hold about 8.13 MiB of the run's state (8,192 "
                              "bytes a position: the context's 512 features, each drafter's fc output and K/V of 2 "
                              "layers), over the 1.00 MiB bound — give levels up to 111")


def test_parity_by_context_with_random_hidden_states() -> None:
    res = CliRunner().invoke(parity_command, [str(TRAINED / "drafter"), str(TRAINED / "drafter"), "--context",
                                              "0,300", "--skip-weights", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    rows = next(s for s in data["sections"] if s["id"] == "by_context")["rows"]
    assert [(r["context"], r["positions"]) for r in rows] == [(0, 32), (300, 300)]
    assert all(r["rel_rms"] == 0 for r in rows)
