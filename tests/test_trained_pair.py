"""The trained pair (fixtures/trained/, made by fixtures/make_trained_pair.py): τ that means something.

A trained drafter reaches τ ≥ 3 on prompts it never saw (fresh ones from any seed), a random drafter of the same
shape stays ≤ 1.3, the speculators layout of the same weights drafts the same, and each planted defect in a copy
of the drafter's GGUF gets its named verdict in dflash-accept (exit 1 under the gates) and fails dflash-parity.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dflashkit.accept import (
    VERDICT_BELOW,
    VERDICT_NONFINITE,
    VERDICT_REFERENCE,
    VERDICT_ZERO,
    load_prompts,
    run_acceptance,
)
from dflashkit.cli import accept_command
from dflashkit.converters.convert import convert
from dflashkit.parity import run_parity
from dflashkit.runtime import HFTarget

from hostile import rewrite_gguf

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
SCRIPT = ROOT / "fixtures" / "make_trained_pair.py"
MAX_NEW = 64
QUIET = dict(progress=False, warn=lambda m: None)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fresh_prompts(out: Path, seed: int, count: int) -> Path:
    """Held-out prompts from the committed script, as a user makes them (no training)."""
    subprocess.run([sys.executable, str(SCRIPT), "--prompts-only", "--seed", str(seed), "--count", str(count),
                    "--out", str(out)], check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def target() -> HFTarget:
    return HFTarget(TRAINED / "target")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 24 prompts: the smallest planted defect (taps shifted by one layer, −8 % τ here) is then significant for any seed
    return fresh_prompts(tmp_path_factory.mktemp("prompts") / "fresh.jsonl", seed=2026, count=24)


@pytest.fixture(scope="module")
def random_drafter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """z-lab's DFlashDraftModel with the trained drafter's config.json and seeded random weights."""
    from dflash.model import DFlashDraftModel
    from transformers import AutoConfig

    out = tmp_path_factory.mktemp("random") / "drafter"
    config = AutoConfig.from_pretrained(TRAINED / "drafter")
    torch.manual_seed(5)
    DFlashDraftModel(config).to(torch.bfloat16).save_pretrained(out)
    return out


def test_committed_pair_fits_16_mb() -> None:
    files = [p for p in TRAINED.rglob("*") if p.is_file()]
    names = {p.relative_to(TRAINED).as_posix() for p in files}
    assert {"target/config.json", "target/model.safetensors", "target/tokenizer.json", "drafter/config.json",
            "drafter/model.safetensors", "drafter-speculators/config.json", "drafter-speculators/model.safetensors",
            "prompts.jsonl"} <= names
    assert sum(p.stat().st_size for p in files) <= 16 * 2**20


def test_sizes_let_the_k_quants_proper_apply() -> None:
    for part in ("target", "drafter"):
        config = json.loads((TRAINED / part / "config.json").read_text())
        assert config["hidden_size"] % 256 == 0 and config["intermediate_size"] % 256 == 0, part
    assert json.loads((TRAINED / "drafter" / "config.json").read_text())["num_hidden_layers"] >= 2


@pytest.mark.slow
def test_prompts_only_is_seeded_and_never_the_committed_set(tmp_path: Path) -> None:
    a = fresh_prompts(tmp_path / "a.jsonl", seed=7, count=5).read_bytes()
    b = fresh_prompts(tmp_path / "b.jsonl", seed=7, count=5).read_bytes()
    c = fresh_prompts(tmp_path / "c.jsonl", seed=8, count=5).read_bytes()
    assert a == b and a != c
    lines = [json.loads(line) for line in a.decode().splitlines()]
    assert len(lines) == 5 and all(set(p) == {"id", "category", "text"} and p["text"] for p in lines)
    committed = {p.text for p in load_prompts(TRAINED / "prompts.jsonl")}
    assert not committed & {p["text"] for p in lines}


def test_prompts_only_usage_errors(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--prompts-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--prompts-only needs --out FILE" in r.stderr


@pytest.mark.slow
def test_trained_drafter_reaches_tau_3_on_fresh_prompts(target: HFTarget, prompts: Path,
                                                         random_drafter: Path) -> None:
    result = run_acceptance(target, [TRAINED / "drafter", random_drafter], prompts, max_new_tokens=MAX_NEW)
    trained, rnd = result.drafters
    assert trained.tau >= 3.0, trained.taus
    assert rnd.tau <= 1.3, rnd.taus
    assert result.verdicts() == [VERDICT_REFERENCE, VERDICT_BELOW]
    # greedy: both reproduce the target's own output, only the rounds differ
    assert [r.output_ids for r in trained.runs] == [r.output_ids for r in rnd.runs]


def test_committed_prompts_give_tau_3_too(target: HFTarget) -> None:
    result = run_acceptance(target, [TRAINED / "drafter"], TRAINED / "prompts.jsonl", max_new_tokens=MAX_NEW,
                            max_prompts=8)
    assert result.drafters[0].tau >= 3.0


def test_speculators_layout_drafts_exactly_as_the_zlab_layout(target: HFTarget, prompts: Path) -> None:
    result = run_acceptance(target, [TRAINED / "drafter", TRAINED / "drafter-speculators"], prompts,
                            max_new_tokens=MAX_NEW, max_prompts=4)
    zlab, spec = result.drafters
    assert spec.info.family_name != zlab.info.family_name
    assert [r.accepted for r in spec.runs] == [r.accepted for r in zlab.runs]


# ---------------------------------------------------------------------------------------------
# Planted defects
# ---------------------------------------------------------------------------------------------


def _float(reader_tensor: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    return np.asarray(dequantize(np.asarray(reader_tensor.data), Q(int(reader_tensor.tensor_type))),
                      np.float32).reshape([int(x) for x in reversed(reader_tensor.shape)])


def plant_defects(good: Path, out: Path) -> dict[str, Path]:
    """Copies of ``good`` with one defect each, as users meet them in the field."""
    import gguf
    from gguf import GGUFValueType as V

    r = gguf.GGUFReader(good)
    tensors = {t.name: t for t in r.tensors}
    taps = [int(v) for v in r.fields["dflash.target_layers"].contents()]
    mask = int(r.fields["tokenizer.ggml.mask_token_id"].contents())
    nan = _float(tensors["blk.1.ffn_down.weight"]).copy()
    nan[3, 5] = np.nan
    swap = {n: n.replace("blk.0.", "blk.#.").replace("blk.1.", "blk.0.").replace("blk.#.", "blk.1.")
            for n in tensors if n.startswith(("blk.0.", "blk.1."))}
    out.mkdir(parents=True, exist_ok=True)
    return {
        "fc-zeroed": rewrite_gguf(good, out / "fc-zeroed.gguf",
                                  replace={"fc.weight": np.zeros_like(_float(tensors["fc.weight"]))}),
        "taps-shifted": rewrite_gguf(good, out / "taps-shifted.gguf",
                                     set_keys={"dflash.target_layers": ([t - 1 for t in taps], V.ARRAY, V.INT32)}),
        "nan-weight": rewrite_gguf(good, out / "nan-weight.gguf", replace={"blk.1.ffn_down.weight": nan}),
        "wrong-mask": rewrite_gguf(good, out / "wrong-mask.gguf",
                                   set_keys={"tokenizer.ggml.mask_token_id": (mask - 300, V.UINT32)}),
        "layers-swapped": rewrite_gguf(good, out / "layers-swapped.gguf", rename=swap),
    }


#: what dflash-accept calls each defect (measured on the committed pair; see the closing note of issue 24)
DEFECT_VERDICTS = {
    "fc-zeroed": VERDICT_BELOW,
    "taps-shifted": VERDICT_BELOW,
    "nan-weight": VERDICT_NONFINITE,
    "wrong-mask": VERDICT_BELOW,
    "layers-swapped": VERDICT_BELOW,
}


@pytest.fixture(scope="module")
def defects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("defects")
    good = root / "drafter-bf16.gguf"
    convert(TRAINED / "drafter", good, outtype="bf16", target=TRAINED / "target", **QUIET)
    return {"good": good, **plant_defects(good, root / "planted")}


@pytest.fixture(scope="module")
def defect_run(target: HFTarget, prompts: Path, defects: dict[str, Path]) -> Any:
    names = list(DEFECT_VERDICTS)
    return names, run_acceptance(target, [defects["good"], *(defects[n] for n in names)], prompts,
                                 max_new_tokens=MAX_NEW)


@pytest.mark.slow
def test_each_planted_defect_gets_its_named_verdict(defect_run: Any) -> None:
    names, result = defect_run
    verdicts = dict(zip(["good", *names], result.verdicts()))
    assert verdicts == {"good": VERDICT_REFERENCE, **DEFECT_VERDICTS}
    good = result.drafters[0]
    assert good.tau >= 3.0
    taus = {name: d.tau for name, d in zip(names, result.drafters[1:])}
    # the fit of the taps is what a shift costs (a few %); the other four leave the drafter almost useless
    assert good.tau * 0.7 < taus.pop("taps-shifted") < good.tau * 0.97
    assert all(t < 2.0 for t in taus.values()), taus
    nan = result.drafters[1 + names.index("nan-weight")]
    assert nan.nonfinite_rounds == sum(r.rounds for r in nan.runs) and nan.accepted_total == 0


def test_non_finite_logits_exit_1_without_any_gate(defect_run: Any) -> None:
    names, result = defect_run
    assert result.exit_code() == 1
    (only,) = result.failures()
    assert only.startswith("nan-weight.gguf: non-finite draft logits in ")


def test_the_gates_name_every_defect(defect_run: Any) -> None:
    names, result = defect_run
    failures = result.failures(max_drop=0.05)
    for name in names:
        assert any(f.startswith(f"{name}.gguf: ") for f in failures), (name, failures)
    rows = {Path(r["drafter"]).stem: r for r in _drafter_rows(json.loads(result.report(max_drop=0.05).to_json()))}
    assert {n: rows[n]["verdict"] for n in DEFECT_VERDICTS} == DEFECT_VERDICTS


def test_cli_min_tau_exits_1_and_names_the_defect(defects: dict[str, Path], prompts: Path) -> None:
    args = [str(defects["good"]), str(defects["fc-zeroed"]), "--target", str(TRAINED / "target"), "--prompts",
            str(prompts), "--max-prompts", "3", "--max-new-tokens", "32", "--min-tau", "2.5", "--json", "-q"]
    res = CliRunner().invoke(accept_command, args)
    assert res.exit_code == 1, res.output
    assert "fc-zeroed.gguf: τ " in res.stderr and "below --min-tau 2.5" in res.stderr
    rows = _drafter_rows(json.loads(res.stdout))
    assert [r["verdict"] for r in rows] == [VERDICT_REFERENCE, VERDICT_BELOW]


def _drafter_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    for section in report["sections"]:
        if section.get("id") == "drafters":
            return section["rows"]
    raise AssertionError("no drafters table")


@pytest.mark.parametrize("defect", list(DEFECT_VERDICTS))
def test_parity_against_the_hf_checkpoint_flags_each_defect(defects: dict[str, Path], defect: str) -> None:
    clean = run_parity(TRAINED / "drafter", defects["good"], target=TRAINED / "target", rounds=2, weights=False)
    assert clean.failures(threshold_top1=0.9) == []
    result = run_parity(TRAINED / "drafter", defects[defect], target=TRAINED / "target", rounds=2, weights=False)
    assert result.exit_code(threshold_top1=0.9) == 1
