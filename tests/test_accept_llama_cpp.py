"""dflash-accept --llama-cpp: τ inside llama.cpp beside the reference runtime's.

The first part runs everywhere: a stand-in ``llama-speculative-simple`` (a script that prints what the real one
prints, or loses it, or refuses) pins the parsing, the rerun-never-guess rule, the refusal verdict and the usage
errors. The second part needs a llama.cpp build (DFLASHKIT_LLAMA_CPP_BIN; CI builds one) and runs the trained pair's
bf16, Q8_0 and Q4_K_M GGUFs and the planted defects through the real binary.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dflashkit.accept import (
    VERDICT_AGREES,
    VERDICT_REFERENCE,
    VERDICT_REFUSED,
    run_acceptance,
)
from dflashkit.cli import accept_command
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError, UsageError
from dflashkit.llama_cpp import LlamaCppLogLost, parse_counts, run_prompt
from dflashkit.runtime import HFTarget

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
QUIET = dict(progress=False, warn=lambda m: None)
BIN = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_BIN", "/nonexistent"))
HAVE_LLAMA = (BIN / "llama-speculative-simple").exists() and (BIN / "llama-quantize").exists()
NEEDS_LLAMA = pytest.mark.skipif(
    not HAVE_LLAMA, reason=os.environ.get("DFLASHKIT_LLAMA_CPP_SKIP_REASON")
    or "set DFLASHKIT_LLAMA_CPP_BIN to a llama.cpp build with llama-speculative-simple and llama-quantize")

# slow: llama-speculative-simple runs on every prompt
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]

# What llama-speculative-simple prints at exit when stderr is not a terminal (timestamp, level letter).
REAL_TAIL = """0.00.217.189 I encoded   12 tokens in    0.012 seconds, speed:  320.461 t/s
0.00.217.215 I decoded   17 tokens in    0.129 seconds, speed:  256.215 t/s
0.00.217.240 I
0.00.217.250 I n_draft   = 15
0.00.217.266 I n_predict = 17
0.00.217.283 I n_drafted = 45
0.00.217.300 I n_accept  = 14
0.00.217.310 I accept    = 31.111%
"""
ROUNDS = "".join(f"0.00.1{i}0.000 D accepted {a}/15 draft tokens, the last target token is: (7)\n"
                 for i, a in enumerate([5, 9, 0]))


def fake_binary(folder: Path, body: str) -> Path:
    """A stand-in llama-speculative-simple: a Python script (``body`` gets ``argv`` and a ``calls`` counter)."""
    folder.mkdir(parents=True, exist_ok=True)
    counter = folder / "calls"
    counter.write_text("0")
    script = folder / "llama-speculative-simple"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom pathlib import Path\nargv = sys.argv[1:]\n"
                      f"c = Path({str(counter)!r}); calls = int(c.read_text()) + 1; c.write_text(str(calls))\n"
                      f"TAIL = {REAL_TAIL!r}\nROUNDS = {ROUNDS!r}\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_parse_counts_reads_the_real_tail() -> None:
    assert parse_counts(REAL_TAIL) == (17, 45, 14)
    assert parse_counts(REAL_TAIL.replace("0.00.217.300 I n_accept  = 14\n", "")) is None


def test_a_run_gives_tau_and_per_round_counts(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path / "bin", "sys.stderr.write(ROUNDS + TAIL)")
    r = run_prompt(binary, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15)
    assert (r.n_predict, r.n_drafted, r.n_accept, r.n_prompt_tokens) == (17, 45, 14, 12)
    assert r.rounds == 3 and r.tau == pytest.approx(17 / 3)
    assert r.accepted == [5, 9, 0] and r.drafted == [15, 15, 15] and r.attempts == 1


def test_a_lost_log_is_rerun_never_guessed(tmp_path: Path) -> None:
    # the counts reach the log only on the third run, as when the logger thread is cut off at exit
    binary = fake_binary(tmp_path / "bin", "sys.stderr.write(ROUNDS + (TAIL if calls >= 3 else TAIL[:120]))")
    r = run_prompt(binary, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15)
    assert r.attempts == 3 and r.n_accept == 14
    never = fake_binary(tmp_path / "bin2", "sys.stderr.write(ROUNDS)")
    with pytest.raises(LlamaCppLogLost, match=r"d\.gguf: llama-speculative-simple exited 0 5 times without printing "
                                              r"its n_predict / n_drafted / n_accept"):
        run_prompt(never, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15)
    assert (tmp_path / "bin2" / "calls").read_text() == "5"


def test_the_command_line_llama_cpp_gets(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path / "bin", "Path(sys.argv[0] + '.argv').write_text('\\n'.join(argv)); "
                                           "sys.stderr.write(TAIL)")
    run_prompt(binary, "t.gguf", "d.gguf", "the prompt", n_predict=40, draft_max=15)
    argv = Path(str(binary) + ".argv").read_text().split("\n")
    pairs = {flag: argv[argv.index(flag) + 1] for flag in ("-m", "-md", "--spec-type", "--spec-draft-n-max", "-p",
                                                           "-n", "--temp", "-t")}
    assert pairs["-m"] == "t.gguf" and pairs["-md"] == "d.gguf" and pairs["--spec-type"] == "draft-dflash"
    assert pairs["--spec-draft-n-max"] == "15" and pairs["-p"] == "the prompt" and pairs["-n"] == "40"
    assert pairs["--temp"] == "0" and pairs["-t"] == "1"
    assert "--no-escape" in argv and "--ignore-eos" not in argv  # a literal backslash-n stays two characters


def test_the_context_holds_a_long_prompt(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path / "bin", "Path(sys.argv[0] + '.argv').write_text('\\n'.join(argv)); "
                                           "sys.stderr.write(TAIL)")
    run_prompt(binary, "t.gguf", "d.gguf", "x", n_predict=128, draft_max=15, prompt_tokens=3000, ignore_eos=True)
    argv = Path(str(binary) + ".argv").read_text().split("\n")
    ctx = int(argv[argv.index("-c") + 1])
    assert ctx >= 3000 + 128 + 15 and "--ignore-eos" in argv


def test_counts_are_read_from_stderr_only(tmp_path: Path) -> None:
    # the generated text (stdout) may hold anything, a fake statistics line included
    binary = fake_binary(tmp_path / "bin", "sys.stdout.write('n_accept  = 0\\n'); sys.stderr.write(ROUNDS + TAIL)")
    assert run_prompt(binary, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15).n_accept == 14
    lost = fake_binary(tmp_path / "bin2", "sys.stdout.write(TAIL)")  # counts only on stdout: lost, not taken
    with pytest.raises(LlamaCppLogLost):
        run_prompt(lost, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15, retries=2)


def test_a_run_cut_short_is_a_refusal_not_a_count(tmp_path: Path) -> None:
    from dflashkit.llama_cpp import LlamaCppRefused

    binary = fake_binary(tmp_path / "bin", "sys.stderr.write('0.1 E main: failed to process speculative batch\\n' + TAIL)")
    with pytest.raises(LlamaCppRefused, match="failed to process speculative batch"):
        run_prompt(binary, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15)


def test_prompts_llama_cpp_cannot_take_are_refused_before_the_runs(tmp_path: Path, trained_target: HFTarget) -> None:
    binary = fake_binary(tmp_path / "bin", "sys.stderr.write(TAIL)")
    target_gguf = tmp_path / "target.gguf"
    target_gguf.write_bytes(b"GGUF")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "nul", "text": "the old\u0000king"}) + "\n")
    with pytest.raises(DFlashError, match="prompt nul: a prompt holds a NUL character"):
        run_acceptance(trained_target, [TRAINED / "drafter"], prompts, max_new_tokens=8, llama_cpp=binary.parent,
                       target_gguf=target_gguf)
    assert (tmp_path / "bin" / "calls").read_text() == "0"


@pytest.fixture(scope="module")
def trained_target() -> HFTarget:
    return HFTarget(TRAINED / "target")


def test_refusal_is_a_verdict_with_llama_cpps_message(tmp_path: Path, trained_target: HFTarget,
                                                       drafter_ggufs: dict[str, Path]) -> None:
    binary = fake_binary(tmp_path / "bin", "sys.stderr.write('llama_model_load: error loading model: missing "
                                           "tensor fc.weight\\nmain: failed to load\\n'); sys.exit(1)")
    target_gguf = tmp_path / "target.gguf"
    target_gguf.write_bytes(b"GGUF")  # the stand-in never reads it
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"text": "the old king walks"}) + "\n")
    result = run_acceptance(trained_target, [drafter_ggufs["bf16"]], prompts, max_new_tokens=8,
                            llama_cpp=binary.parent, target_gguf=target_gguf)
    assert result.verdicts() == [VERDICT_REFERENCE]
    assert result.llama_cpp_verdicts() == [VERDICT_REFUSED]
    assert result.llama_cpp[0].refused == "llama_model_load: error loading model: missing tensor fc.weight"
    assert result.exit_code() == 0
    assert result.failures(max_gap=0.1) == [
        "drafter-bf16.gguf: llama.cpp refused to load it: llama_model_load: error loading model: missing tensor "
        "fc.weight"]
    row = _rows(json.loads(result.report(max_gap=0.1).to_json()))[0]
    assert row["llama_cpp_verdict"] == VERDICT_REFUSED and row["tau_llama_cpp"] is None
    assert row["llama_cpp_message"].endswith("missing tensor fc.weight")


@pytest.mark.parametrize("extra, message", [
    (["--llama-cpp", "{nobin}"], "no executable llama-speculative-simple there"),
    (["--llama-cpp", "{bin}"], "--llama-cpp needs the target as a GGUF: pass --target-gguf FILE"),
    (["--llama-cpp", "{bin}", "--target-gguf", "{missing}"], "--target-gguf {missing}: no such file"),
    (["--target-gguf", "{missing}"], "--target-gguf / --llama-cpp-src only matter with --llama-cpp or --llama-server BIN_DIR"),
    (["--max-gap", "5%"], "--max-gap gates llama.cpp's τ: pass --llama-cpp BIN_DIR or --llama-server BIN_DIR"),
    (["--llama-cpp", "{bin}", "--temperature", "0.7", "--target-gguf", "{fake}"],
     "--llama-cpp measures greedy τ: use it with --temperature 0"),
])
def test_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], message: str) -> None:
    monkeypatch.delenv("DFLASHKIT_LLAMA_CPP_SRC", raising=False)
    binary = fake_binary(tmp_path / "bin", "sys.stderr.write(TAIL)")
    (tmp_path / "nobin").mkdir()
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF")
    fill = {"bin": str(binary.parent), "nobin": str(tmp_path / "nobin"), "missing": str(tmp_path / "none.gguf"),
            "fake": str(fake)}
    args = [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"), "-q"] + [a.format(**fill) for a in extra]
    res = CliRunner().invoke(accept_command, args)
    assert res.exit_code == 2, res.output
    assert message.format(**fill) in res.output
    assert "Traceback" not in res.output


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    return next(s["rows"] for s in report["sections"] if s.get("id") == "drafters")


# ---------------------------------------------------------------------------------------------
# The real llama.cpp
# ---------------------------------------------------------------------------------------------

LLAMA_KEYS = {"tau_llama_cpp", "tau_llama_cpp_ci", "llama_cpp_drafted", "llama_cpp_accepted", "llama_cpp_verdict",
              "verdict"}


@pytest.fixture(scope="module")
def target_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained target as a GGUF: llama.cpp's own converter where its source is at hand, else the fixture
    writer (make_target.make_gguf_target, F32)."""
    from dflashkit.llama_cpp import llama_cpp_src, target_gguf_from_hf

    out = tmp_path_factory.mktemp("target") / "target.gguf"
    src = llama_cpp_src()
    if src is not None:
        return target_gguf_from_hf(TRAINED / "target", out, src)
    import make_target

    return make_target.make_gguf_target(out, TRAINED / "target")


@pytest.fixture(scope="module")
def drafter_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ggufs")
    out = {}
    for outtype in ("bf16", "q8_0", "q4_k_m"):
        out[outtype] = root / f"drafter-{outtype}.gguf"
        convert(TRAINED / "drafter", out[outtype], outtype=outtype, target=TRAINED / "target", **QUIET)
    return out


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_trained_pair

    out = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    make_trained_pair.write_prompts(out, make_trained_pair.held_out_prompts(31, 8))
    return out


@NEEDS_LLAMA
def test_tau_in_llama_cpp_beside_the_reference(trained_target: HFTarget, target_gguf: Path,
                                               drafter_ggufs: dict[str, Path], prompts: Path) -> None:
    result = run_acceptance(trained_target, list(drafter_ggufs.values()), prompts, max_new_tokens=48,
                            llama_cpp=BIN, target_gguf=target_gguf)
    rows = _rows(json.loads(result.report().to_json()))
    for name, row, l in zip(drafter_ggufs, rows, result.llama_cpp):
        assert LLAMA_KEYS <= set(row), name
        assert l.refused is None and len(l.runs) == 8
        assert row["llama_cpp_drafted"] > 0 and row["llama_cpp_accepted"] > 0
        assert math.isfinite(row["tau_llama_cpp"]) and row["tau_llama_cpp"] >= 2.0, (name, row["tau_llama_cpp"])
        assert len(row["tau_llama_cpp_ci"]) == 2
        # llama.cpp tokenizes the prompt text to the same ids as the HF tokenizer
        assert [r.n_prompt_tokens for r in l.runs] == [len(ids) for ids in result.prompt_ids]


@NEEDS_LLAMA
def test_an_hf_drafter_is_converted_on_the_fly(trained_target: HFTarget, target_gguf: Path, prompts: Path) -> None:
    result = run_acceptance(trained_target, [TRAINED / "drafter"], prompts, max_new_tokens=32, max_prompts=3,
                            llama_cpp=BIN, target_gguf=target_gguf)
    assert result.llama_cpp[0].refused is None and result.llama_cpp[0].accepted > 0
    assert any("converted on the fly by dflash-convert" in n for n in result.notes)


@NEEDS_LLAMA
def test_planted_defects_in_llama_cpp(trained_target: HFTarget, target_gguf: Path, drafter_ggufs: dict[str, Path],
                                      prompts: Path, tmp_path: Path) -> None:
    from test_trained_pair import DEFECT_VERDICTS, plant_defects

    planted = plant_defects(drafter_ggufs["bf16"], tmp_path / "planted")
    result = run_acceptance(trained_target, [drafter_ggufs["bf16"], *planted.values()], prompts, max_new_tokens=32,
                            max_prompts=4, llama_cpp=BIN, target_gguf=target_gguf)
    good = result.llama_cpp[0]
    assert good.refused is None and good.tau >= 2.0
    for name, l in zip(planted, result.llama_cpp[1:]):
        # llama.cpp loads every one of them and drafts worse than the good file (it raises no error itself)
        assert l.refused is None, (name, l.refused)
        assert l.tau < good.tau - 0.5, (name, l.tau, good.tau)
    assert list(DEFECT_VERDICTS) == list(planted)
    # the NaN drafter: llama.cpp runs it without a word and accepts nothing
    nan = 1 + list(planted).index("nan-weight")
    assert result.llama_cpp[nan].accepted == 0 and result.llama_cpp_verdicts()[nan] == "zero accepted"


@NEEDS_LLAMA
def test_cli_max_gap(trained_target: HFTarget, target_gguf: Path, drafter_ggufs: dict[str, Path],
                     prompts: Path) -> None:
    args = [str(drafter_ggufs["q8_0"]), "--target", str(TRAINED / "target"), "--prompts", str(prompts),
            "--max-prompts", "3", "--max-new-tokens", "32", "--llama-cpp", str(BIN), "--target-gguf",
            str(target_gguf), "--max-gap", "90%", "--json", "-q"]
    res = CliRunner().invoke(accept_command, args)
    assert res.exit_code == 0, res.output
    row = _rows(json.loads(res.stdout))[0]
    assert row["llama_cpp_verdict"] in (VERDICT_AGREES, "below reference", "above reference")


@NEEDS_LLAMA
def test_the_drafter_preset_is_what_llama_quantize_makes(drafter_ggufs: dict[str, Path], tmp_path: Path) -> None:
    import subprocess

    from dflashkit.quantize.gguf_file import quantize_gguf
    from dflashkit.quantize.policy import get_preset

    f32 = tmp_path / "f32.gguf"
    convert(TRAINED / "drafter", f32, outtype="f32", target=TRAINED / "target", **QUIET)
    ours = tmp_path / "ours.gguf"
    result = quantize_gguf(f32, ours, "q4_k_m_draft", **QUIET)
    types = {c.name: c.new_type.name for c in result.choices}
    assert types["fc.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "Q8_0"
    assert types["blk.0.ffn_gate.weight"] == "Q4_K"
    theirs = tmp_path / "theirs.gguf"
    preset = get_preset("Q4_K_M_DRAFT")
    subprocess.run([str(BIN / "llama-quantize"), *preset.llama_quantize_args(), str(f32), str(theirs), "Q4_K_M"],
                   check=True, capture_output=True, timeout=300)
    assert ours.read_bytes() == theirs.read_bytes()


def test_one_prompt_has_no_ci_but_still_a_verdict_and_a_gap(tmp_path: Path, trained_target: HFTarget,
                                                             drafter_ggufs: dict[str, Path]) -> None:
    # llama.cpp accepting nothing (τ 1.0) against the reference's τ ≈ 14 on one prompt: no CI, the difference itself
    binary = fake_binary(tmp_path / "bin", "sys.stderr.write(TAIL.replace('n_accept  = 14', 'n_accept  = 0'))")
    target_gguf = tmp_path / "target.gguf"
    target_gguf.write_bytes(b"GGUF")
    result = run_acceptance(trained_target, [drafter_ggufs["bf16"]], TRAINED / "prompts.jsonl", max_new_tokens=32,
                            max_prompts=1, llama_cpp=binary.parent, target_gguf=target_gguf)
    assert result.llama_cpp_comparisons()[0].ci is None
    assert result.llama_cpp_verdicts() == ["zero accepted"]
    assert any(" below the reference runtime's " in f and "> --max-gap 10.0%, and significant" in f for f in result.failures(max_gap=0.1))


def test_a_crash_is_a_crash_not_a_refusal(tmp_path: Path, trained_target: HFTarget,
                                          drafter_ggufs: dict[str, Path]) -> None:
    from dflashkit.llama_cpp import LlamaCppCrashed

    # dies by SIGSEGV while loading, as a native build on an AMX CPU does repacking K-quant weights
    body = ("import os, signal\nsys.stderr.write('load_tensors: loading model tensors\\n"
            "D ggml_backend_amx_buffer_set_tensor: amx repack tensor fc.weight of type q4_K\\n'); sys.stderr.flush()\n"
            "os.kill(os.getpid(), signal.SIGSEGV)")
    binary = fake_binary(tmp_path / "bin", body)
    with pytest.raises(LlamaCppCrashed, match=r"^llama-speculative-simple crashed \(SIGSEGV\) while loading: "
                                              r"load_tensors: loading model tensors \| D ggml_backend_amx_buffer_set_"
                                              r"tensor: amx repack tensor fc\.weight of type q4_K"):
        run_prompt(binary, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15)
    assert (tmp_path / "bin" / "calls").read_text() == "1"  # a crash is not rerun
    target_gguf = tmp_path / "target.gguf"
    target_gguf.write_bytes(b"GGUF")
    result = run_acceptance(trained_target, [drafter_ggufs["q4_k_m"]], TRAINED / "prompts.jsonl", max_new_tokens=8,
                            max_prompts=1, llama_cpp=binary.parent, target_gguf=target_gguf)
    assert result.llama_cpp_verdicts() == ["crashed"] and result.llama_cpp[0].crashed
    assert result.failures(max_gap=0.5)[0].startswith("drafter-q4_k_m.gguf: llama.cpp crashed: llama-speculative-"
                                                      "simple crashed (SIGSEGV) while loading")


def test_a_crash_with_weight_repacking_runs_again_without(tmp_path: Path, trained_target: HFTarget,
                                                          drafter_ggufs: dict[str, Path]) -> None:
    """Issue 47: ggml's AMX repacking crash (a signal while loading, a repacked buffer in the log) is run once more
    with --no-repack, and the figure says so."""
    from dflashkit.llama_cpp import NO_REPACK_NOTE

    body = ("import os, signal\nif '--no-repack' not in argv:\n"
            "    sys.stderr.write('load_tensors: CPU_REPACK model buffer size = 1.00 MiB\\n'); sys.stderr.flush()\n"
            "    os.kill(os.getpid(), signal.SIGSEGV)\nsys.stderr.write(ROUNDS + TAIL)")
    binary = fake_binary(tmp_path / "bin", body)
    target_gguf = tmp_path / "target.gguf"
    target_gguf.write_bytes(b"GGUF")
    result = run_acceptance(trained_target, [drafter_ggufs["q4_k_m"]], TRAINED / "prompts.jsonl", max_new_tokens=8,
                            max_prompts=2, llama_cpp=binary.parent, target_gguf=target_gguf)
    run = result.llama_cpp[0]
    assert not run.refused and run.note == NO_REPACK_NOTE and run.tau == pytest.approx(17 / 3)
    assert (tmp_path / "bin" / "calls").read_text() == "3"  # the crash, then each prompt without repacking
    assert NO_REPACK_NOTE in result.report().render("text")


def test_llama_cpp_arg_reaches_the_command_line(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path / "bin", "Path(sys.argv[0] + '.argv').write_text('\\n'.join(argv)); "
                                           "sys.stderr.write(TAIL)")
    run_prompt(binary, "t.gguf", "d.gguf", "x", n_predict=16, draft_max=15, extra_args=["--no-repack", "-fa", "on"])
    argv = Path(str(binary) + ".argv").read_text().split("\n")
    assert argv[-3:] == ["--no-repack", "-fa", "on"]
    res = CliRunner().invoke(accept_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"),
                                              "--llama-cpp", str(binary.parent), "--llama-cpp-arg=-md", "-q"])
    assert res.exit_code == 2 and "error: --llama-cpp-arg -md: -md loads a model — dflashkit sets the models" in res.output


@pytest.mark.parametrize("tail, problem", [
    (REAL_TAIL.replace("n_accept  = 14", "n_accept  = 50"), "more draft tokens accepted than drafted"),
    (REAL_TAIL.replace("n_drafted = 45", "n_drafted = -3"), "a negative count"),
    (REAL_TAIL.replace("n_accept  = 14", "n_accept  = 17"), "every committed token accepted from a draft"),
    (REAL_TAIL.replace("n_predict = 17", "n_predict = 170").replace("n_accept  = 14", "n_accept  = 160")
     .replace("n_drafted = 45", "n_drafted = 200"), "τ 17.00 above the block of 16 tokens"),
])
def test_impossible_counts_are_refused(tmp_path: Path, tail: str, problem: str) -> None:
    binary = fake_binary(tmp_path / "bin", f"sys.stderr.write({tail!r})")
    with pytest.raises(DFlashError) as err:
        run_prompt(binary, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15)
    assert str(err.value).startswith(f"d.gguf: llama-speculative-simple reported impossible counts ({problem}")
    assert "refused, not reported" in str(err.value)


def test_a_chatty_build_is_read_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dflashkit.llama_cpp import process

    # 24 MB of log between the load lines and the counts: only the head and the tail are kept, the counts are read
    body = ("sys.stderr.write('llama_model_loader: loaded meta data\\n'); "
            "[sys.stderr.write('D noise ' + 'x' * 1000 + '\\n') for _ in range(24000)]; sys.stderr.write(TAIL)")
    binary = fake_binary(tmp_path / "bin", body)
    seen: list[int] = []
    original = process.run_bounded

    def spy(cmd: list[str], *, timeout: float) -> tuple[int, str]:
        code, text = original(cmd, timeout=timeout)
        seen.append(len(text))
        return code, text

    monkeypatch.setattr("dflashkit.llama_cpp.speculative_simple.run_bounded", spy)
    r = run_prompt(binary, "t.gguf", "d.gguf", "hello", n_predict=16, draft_max=15)
    assert (r.n_predict, r.n_drafted, r.n_accept) == (17, 45, 14)
    assert seen and seen[0] <= process.HEAD_BYTES + process.TAIL_BYTES + 64 * 1024 + 16
