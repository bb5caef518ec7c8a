"""The trained EAGLE-3 drafter (``fixtures/trained/drafter-eagle3``: speculators 0.9.0's ``Eagle3DraftModel`` trained
by ``fixtures/make_eagle3_trained.py`` for the trained target) in dflashkit's runtime and in llama.cpp: τ equal
prompt by prompt, both builds, both tools (llama-server and llama-speculative-simple), at llama.cpp's default n-max
(3) and beyond it (draft-eagle3 has no clamp), from the checkpoint and from its GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashkit.accept import VERDICT_AGREES, run_acceptance
from dflashkit.converters.convert import convert
from dflashkit.llama_cpp import target_gguf_from_hf
from dflashkit.runtime import HFTarget
from llama_cpp_oracle import BIN_VARS, require_llama_cpp_build

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
DRAFTER = TRAINED / "drafter-eagle3"
N_PREDICT = 48

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eagle3-accept")
    out = {"bf16": root / "drafter-eagle3-bf16.gguf"}
    convert(DRAFTER, out["bf16"], outtype="bf16", target=TRAINED / "target", progress=False, warn=lambda _: None)
    return out


@pytest.fixture(scope="module")
def target() -> HFTarget:
    return HFTarget(TRAINED / "target")


def _rows(result, section: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return next(s["rows"] for s in json.loads(result.report().to_json())["sections"] if s.get("id") == section)


def test_the_committed_drafter_is_speculators_own_and_names_no_local_path() -> None:
    """Trained with speculators' own classes, saved with no path of the machine it was trained on."""
    config = json.loads((DRAFTER / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert "/tmp/" not in json.dumps(config) and "/work/" not in json.dumps(config)


@pytest.mark.parametrize("build", list(BIN_VARS))
def test_llama_server_and_the_runtime_agree_prompt_by_prompt(build: str, target: HFTarget, files: dict[str, Path],
                                                             tmp_path: Path) -> None:
    binary, src = require_llama_cpp_build(build, "llama-server")
    target_gguf = target_gguf_from_hf(TRAINED / "target", tmp_path / "target.gguf", src)
    result = run_acceptance(target, [files["bf16"]], TRAINED / "prompts.jsonl", max_new_tokens=N_PREDICT,
                            llama_cpp=binary, llama_server=binary, target_gguf=target_gguf, draft_n_max=(None, 8))
    d, ran = result.drafters[0], result.llama_cpp[0]
    assert d.schedule == "server" and ran.refused is None
    assert d.schedule_taus == ran.taus and result.llama_cpp_verdicts() == [VERDICT_AGREES]  # every prompt, exactly
    assert ran.tau > 3.5  # n-max 3: at most 4
    rows = _rows(result, "serving")
    assert [r["draft_n_max"] for r in rows] == [3, 8]  # None: llama.cpp's default n-max for EAGLE-3
    for row in rows:
        assert row["refused"] is None and row["tau_per_prompt"] == row["reference_tau_per_prompt"], row
        assert row["tau_verdict"] == VERDICT_AGREES and row["identical_output"] == "yes"
    assert rows[1]["tau"] > 7.0  # a chain of 8 drafts 8: llama.cpp does not clamp draft-eagle3's n-max
    assert result.failures(max_gap=0.0) == []


@pytest.mark.parametrize("build", list(BIN_VARS))
def test_llama_speculative_simple_and_the_runtime_agree_from_the_checkpoint(build: str, target: HFTarget,
                                                                            tmp_path: Path) -> None:
    """The publisher's check: the checkpoint itself (converted as llama.cpp's converter would write it), on
    llama-speculative-simple's schedule (the prompt's last token is the first anchor)."""
    binary, src = require_llama_cpp_build(build, "llama-speculative-simple")
    simple = tmp_path / "bin"
    simple.mkdir()
    (simple / "llama-speculative-simple").symlink_to(binary.resolve() / "llama-speculative-simple")
    result = run_acceptance(target, [DRAFTER], TRAINED / "prompts.jsonl", max_new_tokens=N_PREDICT,
                            llama_cpp=simple, llama_cpp_src=src)
    d, ran = result.drafters[0], result.llama_cpp[0]
    assert d.schedule == "simple" and ran.refused is None
    assert d.schedule_taus == ran.taus and result.llama_cpp_verdicts() == [VERDICT_AGREES]
    assert ran.tau > 3.5


@pytest.mark.parametrize("build", list(BIN_VARS))
def test_imatrix_rounds_and_quantize_with_it_as_llama_quantize(build: str, files: dict[str, Path],
                                                               tmp_path: Path) -> None:
    """dflash-imatrix runs the chain's real rounds; dflash-quantize --imatrix is llama-quantize --imatrix byte for
    byte — token_embd (a lookup: no importance matrix has weights for it) quantized without, as llama.cpp does."""
    import subprocess

    from dflashkit.imatrix_collect import collect_imatrix, write_imatrix
    from dflashkit.quantize.gguf_file import quantize_gguf

    binary, _ = require_llama_cpp_build(build, "llama-quantize")
    f16 = convert(DRAFTER, tmp_path / "f16.gguf", outtype="f16", target=TRAINED / "target", progress=False,
                  warn=lambda _: None).out
    matrix = tmp_path / "imatrix.gguf"
    write_imatrix(collect_imatrix(f16, TRAINED / "target", TRAINED / "prompts.jsonl", max_prompts=4), matrix)
    for qtype in ("Q4_K_M", "IQ4_XS"):
        theirs = tmp_path / f"theirs-{qtype}.gguf"
        subprocess.run([str(binary / "llama-quantize"), "--imatrix", str(matrix), str(f16), str(theirs), qtype],
                       check=True, capture_output=True)
        ours = quantize_gguf(f16, tmp_path / f"ours-{qtype}.gguf", qtype, imatrix=matrix, progress=False,
                             warn=lambda _: None).out
        assert Path(ours).read_bytes() == theirs.read_bytes(), qtype


def test_a_release_of_the_eagle3_drafter(tmp_path: Path) -> None:
    """dflash-release: every type made and checked, the card says what the drafter is and how llama.cpp runs it,
    and --check holds (an eagle3 file stores no block size: its family's is the record's)."""
    from dflashkit.accept.options import PromptOptions
    from dflashkit.release import check_release, release

    out = tmp_path / "release"
    release(DRAFTER, out, target=TRAINED / "target", types=("bf16", "q8_0"), workers=1,
            prompt_options=PromptOptions(max_prompts=3, max_new_tokens=16), parity_rounds=2)
    assert check_release(out) == []
    card = (out / "README.md").read_text()
    assert "\n- eagle3\n" in card and "\n- dflash\n" not in card
    assert ("EAGLE-3 drafter (eagle3: one decoder layer over three target layers, drafting a chain of "
            "--spec-draft-n-max tokens a round, 3 by default) for speculative decoding") in card
    assert "--spec-type draft-eagle3 --spec-draft-n-max 3" in card
    record = json.loads((out / "release.json").read_text())
    assert record["family"] == "eagle3" and record["block_size"] == 4 and record["spec_type"] == "draft-eagle3"


def test_planted_defects_are_named(files: dict[str, Path], target: HFTarget, tmp_path: Path) -> None:
    """What an EAGLE-3 file can get wrong, as the DFlash pair's tests plant it: a zeroed fc drafts blind to the
    target (below reference), taps shifted up one layer read past the 4-layer target (refused by the drafter ↔ target rule that
    names the taps), and the wrong target's tokenizer (llama.cpp never checks an EAGLE-3 drafter's vocabulary
    against its target) is flagged by dflash-inspect."""
    import gguf
    import numpy as np
    from gguf import GGUFValueType as V

    from dflashkit.errors import UsageError
    from hostile import rewrite_gguf
    from test_inspect_drafter import findings

    good = convert(DRAFTER, tmp_path / "f16.gguf", outtype="f16", target=TRAINED / "target", progress=False,
                   warn=lambda _: None).out  # gguf-py rewrites F16, not BF16
    fc = next(t for t in gguf.GGUFReader(good).tensors if t.name == "fc.weight").data
    zeroed = rewrite_gguf(good, tmp_path / "zeroed-fc.gguf", replace={"fc.weight": np.zeros_like(fc)})
    result = run_acceptance(target, [good, zeroed], TRAINED / "prompts.jsonl", max_new_tokens=32, max_prompts=6)
    assert result.verdicts() == ["reference", "below reference"]
    # blind to the target, the chain still reads each next token: on this corpus of fixed phrases that alone keeps
    # τ 2.56 of 3.88 (a DFlash drafter's block has no token to read: its zeroed fc gives 1.1)
    assert result.drafters[0].tau > 3.5 and result.drafters[1].tau < result.drafters[0].tau - 1.0

    shifted = rewrite_gguf(good, tmp_path / "shifted.gguf",
                           set_keys={"eagle3.target_layers": ([2, 3, 4], V.ARRAY, V.INT32)})
    with pytest.raises(UsageError, match=r"taps target layer id\(s\) \[3\] but target .* has 4 layers"):
        run_acceptance(target, [shifted], TRAINED / "prompts.jsonl", max_new_tokens=8, max_prompts=1)
    assert "target.tap_range" in findings(shifted, target=str(TRAINED / "target"))

    other = TRAINED.parent / "trained-long" / "target"  # the same shape, another tokenizer
    wrong = convert(DRAFTER, tmp_path / "wrong-tokenizer.gguf", outtype="bf16", target=other, progress=False,
                    warn=lambda _: None).out
    found = findings(wrong, target=str(TRAINED / "target"))
    assert [f.severity.value for f in found["target.tokenizer"]] == ["error"]
