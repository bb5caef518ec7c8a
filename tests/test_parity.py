"""dflash-parity: same-as-f32 files agree exactly, quantized files degrade monotonically, the dump re-runs.

Part of the test extra (the HF-target runs use transformers; the dump is re-run through z-lab's
``dflash`` package): ``pip install "transformers==5.15.0"`` and ``pip install --no-deps dflash==0.1.0``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from dflash import model as zl

import make_drafters
import make_target
from conftest import FAMILIES, target_for
from dflashkit.cli import parity_command
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError, UsageError
from dflashkit.parity import accepted_prefix, run_parity
from dflashkit.quantize.gguf_file import quantize_gguf
from test_runtime import reference_model

QUANTS = ("Q8_0", "Q6_K", "Q4_K_M")


def _convert(src: Path, out: Path, outtype: str, target: Path) -> Path:
    convert(src, out, outtype=outtype, target=target, progress=False, warn=lambda m: None)
    return out


@pytest.fixture(scope="module")
def f32_files(drafters: dict[str, Path], targets: dict[int, dict[str, Path]], tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parity_f32")
    return {f: _convert(drafters[f], root / f"{f}.gguf", "f32", target_for(f, targets)) for f in FAMILIES}


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict[str, Path]:
    """A qwen3-b16 drafter whose every row length is a multiple of 256 (K-quants apply everywhere),
    its 256-wide target (GGUF) and the drafter as F32 / Q8_0 / Q6_K / Q4_K_M GGUFs."""
    root = tmp_path_factory.mktemp("parity_wide")
    overrides = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "head_dim": 64}
    drafter = make_drafters.make_drafter(root / "drafter", "qwen3-b16", config_overrides=overrides)
    hf = make_target.make_hf_target(root / "target-hf", hidden_size=256, n_layers=make_drafters.TARGET_LAYERS,
                                    head_dim=64)
    target = make_target.make_gguf_target(root / "target.gguf", hf)
    files = {"hf": drafter, "target": target, "F32": _convert(drafter, root / "f32.gguf", "f32", target),
             "Q8_0": _convert(drafter, root / "q8_0.gguf", "q8_0", target)}
    for ft in QUANTS[1:]:
        quantize_gguf(files["F32"], root / f"{ft}.gguf", ft, progress=False, warn=lambda m: None)
        files[ft] = root / f"{ft}.gguf"
    return files


# ---------------------------------------------------------------------------------------------
# Same-as-f32: 100 % top-1, zero KL
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_same_as_f32_is_exact(drafters, targets, f32_files, family: str) -> None:
    r = run_parity(drafters[family], f32_files[family], target=target_for(family, targets), rounds=2)
    assert r.mode == "gguf-target"
    if family in ("qwen35-swa", "gemma4"):  # sliding layers, no is_causal: llama.cpp runs them bidirectional
        sliding = {"qwen35-swa": "0, 1 causal and 2", "gemma4": "0, 1, 2, 3 causal and 4"}[family]
        assert r.hidden_overall.rel_rms > 0 and r.causes[0] == (
            f"per-layer causality — the reference runs layers {sliding} bidirectional, the candidate (as llama.cpp "
            "runs the file: one flag for every layer) every layer bidirectional")
        # gemma4 is DFlash 1 with a softcap llama.cpp does not apply (tests/test_divergences_heads.py)
        assert [c.split(":")[0] for c in r.causes[1:]] == (["final_logit_softcapping"] if family == "gemma4" else [])
        return
    if family == "optional":  # rope dims 8 of 64, value scale 0.75, logit scale 0.5: llama.cpp runs each otherwise
        assert [c.split(":")[0] for c in r.causes] == ["partial_rotary_factor", "attention_value_scale",
                                                      "output_multiplier"]
        assert r.overall.kl_mean > 0
        return
    assert r.causes == []
    assert r.overall.top1 == 1.0 and r.overall.top5 == 1.0
    assert r.overall.kl_max == 0.0 and r.overall.max_abs == 0.0 and r.hidden_overall.rel_rms == 0.0
    assert all(x.candidate_accepted == r.block_size - 1 for x in r.rounds)
    assert r.weights is not None and r.weights.rel_rms_summary()["max"] == 0.0
    assert r.exit_code(threshold_top1=1.0, threshold_kl=0.0) == 0
    # without a target, parity is on the hidden states, and says so
    bare = run_parity(drafters[family], f32_files[family], weights=False)
    assert bare.mode == "no-target" and bare.overall is None and bare.hidden_overall.rel_rms == 0.0
    assert "logits need a target head" in bare.report().to_text()


def test_cli_same_as_f32_with_hf_target(drafters, targets, f32_files) -> None:
    res = CliRunner().invoke(parity_command, [
        str(drafters["qwen3-b16"]), str(f32_files["qwen3-b16"]), "--target", str(targets[64]["hf"]),
        "--rounds", "3", "--threshold-top1", "100%", "--threshold-kl", "1e-9", "--json",
    ])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    s = report["summary"]
    assert s["mode"] == "hf-target" and s["top1"] == 1.0 and s["kl"] == [0.0, 0.0, 0.0] and s["exit_code"] == 0
    rounds = next(x for x in report["sections"] if x["id"] == "rounds")["rows"]
    assert len(rounds) == 3 and rounds[1]["start"] == rounds[0]["start"] + rounds[0]["produced"]
    logits = next(x for x in report["sections"] if x["id"] == "logits")["rows"]
    assert [row["position"] for row in logits] == list(range(1, 16)) + ["all"]


# ---------------------------------------------------------------------------------------------
# Quantized files: sensible, monotone degradation
# ---------------------------------------------------------------------------------------------


def test_quantized_degrade_monotonically(wide: dict[str, Path]) -> None:
    # the weights' own rounding (float32 activations): llama.cpp's Q8 activations are test_ggml_rounding's
    results = {q: run_parity(wide["hf"], wide[q], target=wide["target"], rounds=3, ggml_activations=False)
               for q in ("F32",) + QUANTS}
    kl = [results[q].overall.kl_mean for q in ("F32",) + QUANTS]
    hidden = [results[q].hidden_overall.rel_rms for q in ("F32",) + QUANTS]
    weights = [results[q].weights.rel_rms_summary()["median"] for q in ("F32",) + QUANTS]
    top1 = [results[q].overall.top1 for q in ("F32",) + QUANTS]
    assert kl[0] == 0.0 and all(a < b for a, b in zip(kl, kl[1:])), kl
    assert all(a < b for a, b in zip(hidden, hidden[1:])), hidden
    assert all(a < b for a, b in zip(weights, weights[1:])), weights
    assert top1[0] == 1.0 and all(a >= b for a, b in zip(top1, top1[1:])), top1
    # sensible magnitudes: Q8_0 is close, Q4_K_M still recognisably the same drafter
    assert kl[1] < 1e-4 and top1[1] > 0.9
    assert 1e-4 < kl[3] < 0.05 and top1[3] > 0.5
    for q in QUANTS:
        assert "dequantized" in results[q].candidate.matmul
        text = results[q].report().to_text()
        assert "Logit parity per block position" in text and q.split("_")[0] in text


def test_cli_gate_fails_on_threshold(wide: dict[str, Path]) -> None:
    args = [str(wide["hf"]), str(wide["Q4_K_M"]), "--target", str(wide["target"]), "--skip-weights"]
    res = CliRunner().invoke(parity_command, args + ["--threshold-top1", "0.99"])
    assert res.exit_code == 1
    assert "FAIL: top-1 agreement" in res.stdout and "--threshold-top1 99.00%" in res.stdout
    res = CliRunner().invoke(parity_command, args + ["--threshold-kl", "1e-6", "--markdown"])
    assert res.exit_code == 1 and res.stdout.startswith("## dflash-parity") and "--threshold-kl" in res.stderr
    res = CliRunner().invoke(parity_command, args + ["--threshold-top1", "0.5", "--threshold-kl", "0.05"])
    assert res.exit_code == 0, res.output


# ---------------------------------------------------------------------------------------------
# The dump: exact format, re-runnable in z-lab's implementation
# ---------------------------------------------------------------------------------------------


def test_dump_format_and_rerun_in_reference(drafters, targets, f32_files, tmp_path: Path) -> None:
    family = "gemma4"  # softcap + embedding scale + SWA: everything the dump must carry
    dump = tmp_path / "parity.npz"
    hf_target = targets[72]["hf"]
    run_parity(drafters[family], f32_files[family], target=hf_target, dump=dump, weights=False)
    d = np.load(dump)
    spec_h, block, vocab, taps = 72, 16, 512, 5
    ctx = d["target_hidden"].shape[1]
    want = {
        "context_ids": (np.int64, (1, ctx)),
        "target_hidden": (np.float32, (1, ctx, taps * spec_h)),
        "block_ids": (np.int64, (1, block)),
        "position_ids": (np.int64, (1, ctx + block)),
        "noise_embedding": (np.float32, (1, block, spec_h)),
        "logits_reference": (np.float32, (1, block - 1, vocab)),
        "logits_candidate": (np.float32, (1, block - 1, vocab)),
        "hidden_reference": (np.float32, (1, block, spec_h)),
        "hidden_candidate": (np.float32, (1, block, spec_h)),
    }
    assert set(d.files) == set(want) | {"meta"}  # same taps/mask: no *_candidate extras
    for key, (dtype, shape) in want.items():
        assert d[key].dtype == dtype and d[key].shape == shape, key
    assert d["meta"].shape == () and d["meta"].dtype.kind == "U"
    meta = json.loads(str(d["meta"]))
    assert meta["reference"]["path"] == str(drafters[family]) and meta["candidate"]["dialect"] == "llama.cpp"
    assert meta["target"] == str(hf_target) and meta["device"] == "cpu" and meta["dtype"] == "float32"
    assert d["block_ids"][0, 1:].tolist() == [4] * (block - 1)  # [anchor, mask, ...]
    assert d["position_ids"][0].tolist() == list(range(ctx + block))

    # Re-run the dumped inputs through z-lab's model: the same logits come out.
    ref = reference_model(drafters[family])
    with torch.inference_mode():
        hidden = ref(target_hidden=torch.from_numpy(d["target_hidden"]),
                     noise_embedding=torch.from_numpy(d["noise_embedding"]),
                     position_ids=torch.from_numpy(d["position_ids"]))
        lm_head = torch.nn.Linear(spec_h, vocab, bias=False)
        from safetensors.numpy import load_file

        lm_head.weight.copy_(torch.from_numpy(load_file(str(hf_target / "model.safetensors"))["lm_head.weight"]))
        logits = ref.compute_logits(hidden[:, 1:], lm_head)
    np.testing.assert_allclose(hidden.numpy(), d["hidden_reference"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits.numpy(), d["logits_reference"], rtol=1e-5, atol=1e-5)
    # and the target's tap features of the context ids are what was dumped (offset 1)
    from transformers import AutoModelForCausalLM

    tgt = AutoModelForCausalLM.from_pretrained(hf_target, dtype=torch.float32)
    with torch.inference_mode():
        out = tgt(torch.from_numpy(d["context_ids"]), output_hidden_states=True)
    feats = zl.extract_context_feature(out.hidden_states, [1, 3, 5, 7, 9])
    np.testing.assert_allclose(feats.numpy(), d["target_hidden"], rtol=1e-4, atol=1e-5)


def test_dump_without_target_and_refusal_to_overwrite(drafters, f32_files, tmp_path: Path) -> None:
    dump = tmp_path / "bare.npz"
    run_parity(drafters["dflash2"], f32_files["dflash2"], dump=dump, weights=False, rounds=2)
    d = np.load(dump)
    assert "logits_reference" not in d.files and "context_ids" not in d.files
    assert d["hidden_reference"].shape == (1, 16, 64) and np.array_equal(d["hidden_reference"], d["hidden_candidate"])
    with pytest.raises(DFlashError, match="already exists"):
        run_parity(drafters["dflash2"], f32_files["dflash2"], dump=dump)
    run_parity(drafters["dflash2"], f32_files["dflash2"], dump=dump, force=True, weights=False)


# ---------------------------------------------------------------------------------------------
# What only running the drafter shows: same weights, different taps
# ---------------------------------------------------------------------------------------------


def test_shifted_taps_fail_parity_with_identical_weights(drafters, targets, tmp_path: Path) -> None:
    shifted = tmp_path / "shifted"
    shutil.copytree(drafters["qwen3-b16"], shifted)
    config = json.loads((shifted / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [2, 9]  # the classic off-by-one
    (shifted / "config.json").write_text(json.dumps(config))
    r = run_parity(drafters["qwen3-b16"], shifted, target=targets[64]["hf"], rounds=2)
    assert r.weights.rel_rms_summary()["max"] == 0.0  # a weight diff sees nothing wrong...
    assert [d.field for d in r.weights.meaning_differences] == ["target_layer_ids"]
    assert r.overall.kl_mean > 0 and r.hidden_overall.rel_rms > 1e-3  # ...running it does
    assert "meaning differs: target_layer_ids" in r.report().to_text()


# ---------------------------------------------------------------------------------------------
# Errors and small pieces
# ---------------------------------------------------------------------------------------------


def test_usage_errors(drafters, targets, f32_files, tmp_path: Path) -> None:
    a, b = str(drafters["qwen3-b16"]), str(f32_files["qwen3-b16"])
    runner = CliRunner()
    res = runner.invoke(parity_command, [a, b, "--threshold-top1", "0.9"])
    assert res.exit_code == 2 and "need a target head" in res.stderr
    res = runner.invoke(parity_command, [a, b, "--prompt", "hi", "--target", str(targets[64]["gguf"])])
    assert res.exit_code == 2 and "HF model directory" in res.stderr
    res = runner.invoke(parity_command, [a, b, "--threshold-top1", "150%", "--target", str(targets[64]["gguf"])])
    assert res.exit_code == 2
    res = runner.invoke(parity_command, [a, str(tmp_path / "missing.gguf")])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1 and "missing.gguf" in res.stderr
    res = runner.invoke(parity_command, [a, b, "--target", str(targets[64]["hf"]), "--prompt-ids", "1,x"])
    assert res.exit_code == 2
    res = runner.invoke(parity_command, [a, str(drafters["optional"])])  # block 16 vs 8
    assert res.exit_code == 1 and "block size" in res.stderr
    with pytest.raises(UsageError, match="outside the target vocabulary"):
        run_parity(a, b, target=targets[64]["hf"], prompt_ids=[1, 99999])


def test_prompt_ids_and_prompt(drafters, targets, f32_files) -> None:
    r = run_parity(drafters["qwen3-b16"], f32_files["qwen3-b16"], target=targets[64]["hf"], prompt_ids=[1, 2, 3, 4],
                   weights=False)
    assert r.prompt_ids == [1, 2, 3, 4] and r.rounds[0].start == 4
    r = run_parity(drafters["qwen3-b16"], f32_files["qwen3-b16"], target=targets[64]["hf"], prompt="Hello there",
                   weights=False)
    assert r.prompt_ids and r.overall.top1 == 1.0


def test_accepted_prefix() -> None:
    assert accepted_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert accepted_prefix([5], [6]) == 0
    assert accepted_prefix([1, 2], [1, 2]) == 2


def test_kl_is_reference_to_candidate_by_hand() -> None:
    """KL(ref ‖ cand) = Σ p_ref · ln(p_ref / p_cand), on two rows whose two directions differ."""
    from dflashkit.parity.stats import logit_rows as _logit_rows, logit_stats as _logit_stats

    ref = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)],
                        [math.log(0.7), math.log(0.2), math.log(0.1)]])
    cand = torch.tensor([[0.0, 0.0, 0.0],
                         [math.log(0.2), math.log(0.3), math.log(0.5)]])
    want = [0.5 * math.log(0.5 * 3) + 0.5 * math.log(0.25 * 3),  # = 0.5 ln 1.125 ≈ 0.0589 (reverse: ≈ 0.0566)
            0.7 * math.log(0.7 / 0.2) + 0.2 * math.log(0.2 / 0.3) + 0.1 * math.log(0.1 / 0.5)]  # ≈ 0.6349 (reverse ≈ 0.6758)
    rows = _logit_rows(ref, cand)
    assert rows["kl"].tolist() == pytest.approx(want, rel=1e-6)
    stats = _logit_stats(rows)
    assert stats.kl_mean == pytest.approx(sum(want) / 2, rel=1e-6) and stats.kl_max == pytest.approx(want[1], rel=1e-6)
    assert stats.top1 == 0.5  # row 1: argmax 0 vs 0 (ties resolve to the first); row 2: 0 vs 2
