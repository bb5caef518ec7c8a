"""The drafter ↔ target rule table (`dflashkit.target_rules.TARGET_RULES`) is what every command runs: one broken
rule (the trained drafter re-labelled for a 6-layer target, run against its 4-layer target) is refused by convert,
inspect, accept and parity alike, each in its own words and exit code, with the rule's facts in the message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflashkit.cli import accept_command, convert_command, inspect_command, parity_command
from dflashkit.target_rules import TARGET_RULES, Target, check_runtime_fit

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def six_layer_drafter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("six") / "drafter"
    shutil.copytree(TRAINED / "drafter", d)
    config = json.loads((d / "config.json").read_text())
    config["num_target_layers"] = 6
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_every_rule_speaks_to_every_caller() -> None:
    assert [r.id for r in TARGET_RULES] == [
        "target.hidden_size", "target.mask_token", "target.selector_vocab", "target.tap_range", "target.layer_count",
    ]
    assert all(r.convert is not None and r.runtime is not None and r.needs for r in TARGET_RULES)
    # inspect checks the selector codebooks against the file's own vocabulary instead
    assert [r.id for r in TARGET_RULES if r.inspect is None] == ["target.selector_vocab"]


def test_convert(six_layer_drafter: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(convert_command, [str(six_layer_drafter), str(tmp_path / "d.gguf"), "--target", str(TARGET),
                                             "-q"])
    assert r.exit_code == 1
    assert r.output.strip() == (f"error: {TARGET}: target has 4 layers but the drafter config says num_target_layers "
                                "= 6 — wrong target model")
    assert not (tmp_path / "d.gguf").exists()


def test_inspect(six_layer_drafter: Path) -> None:
    r = CliRunner().invoke(inspect_command, [str(six_layer_drafter), "--target", str(TARGET), "--format", "json"])
    findings = {f["id"]: f for f in json.loads(r.stdout)["files"][0]["findings"]}
    assert r.exit_code == 1
    assert findings["target.layer_count"]["values"] == {"drafter": 6, "target": 4}
    assert findings["target.layer_count"]["message"] == (f"{six_layer_drafter}: drafter was trained for a 6-layer "
                                                         f"target, {TARGET} has 4")


def test_accept(six_layer_drafter: Path) -> None:
    r = CliRunner().invoke(accept_command, [str(six_layer_drafter), "--target", str(TARGET), "--prompts",
                                            str(TRAINED / "prompts.jsonl"), "--max-prompts", "1",
                                            "--max-new-tokens", "8", "-q"])
    assert r.exit_code == 2, r.output
    assert f"drafter {six_layer_drafter}: drafter was trained for a 6-layer target, {TARGET} has 4 — wrong target " \
           "for this drafter" in r.output


def test_parity(six_layer_drafter: Path) -> None:
    r = CliRunner().invoke(parity_command, [str(TRAINED / "drafter"), str(six_layer_drafter), "--target", str(TARGET),
                                            "--skip-weights", "-q"])
    assert r.exit_code == 1, r.output
    assert f"candidate drafter {six_layer_drafter}: drafter was trained for a 6-layer target, {TARGET} has 4" \
           in r.output


def test_a_field_the_caller_does_not_know_skips_its_rules() -> None:
    from dflashkit.families import read_hf_config

    _, spec = read_hf_config(json.loads((TRAINED / "drafter" / "config.json").read_text()))
    check_runtime_fit(spec, Target("t", hidden_size=256, n_layers=None, vocab_size=768), "d")  # taps unknown: fine
    with pytest.raises(Exception, match="d: taps target layer id\\(s\\) \\[2\\] but target t has 3 layers"):
        check_runtime_fit(spec, Target("t", hidden_size=256, n_layers=3, vocab_size=768), "d")
    with pytest.raises(Exception, match="d: hidden_size 256 ≠ target t hidden size 128 — wrong target for this"):
        check_runtime_fit(spec, Target("t", hidden_size=128), "d")
