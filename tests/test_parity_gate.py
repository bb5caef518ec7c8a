"""dflash-parity's default gate (`dflashkit.parity.thresholds`): without --threshold-top1 / --threshold-kl a float or
8-bit file must draft what its reference drafts, so ``dflash-parity CHECKPOINT FILE.gguf`` fails a file that loses
the checkpoint's meaning — named, with the likely cause — and passes one that keeps it; below 8 bits there is no
default (the loss is the publisher's choice), and ``--no-default-gate`` turns it off."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflashkit.cli import convert_command, parity_command, quantize_command
from dflashkit.parity.thresholds import DEFAULT_GATES, Gate, precision_class, resolve_gate

ROOT = Path(__file__).resolve().parents[1]
LONG = ROOT / "fixtures" / "trained-long"
CAUSE = ("likely cause: per-layer causality — the reference runs layers 0, 1, 2 causal and 3 bidirectional, the "
         "candidate (as llama.cpp runs the file: one flag for every layer) every layer bidirectional")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("types, expected", [
    ({"BF16": 29, "F32": 18}, "float"), ({"F16": 3}, "float"), ({"Q8_0": 28, "F32": 18}, "8-bit"),
    ({"Q8_0": 1, "BF16": 1}, "8-bit"), ({"Q6_K": 1, "F32": 1}, None), ({"Q4_K": 5}, None), ({"NOPE": 1}, None),
    ({"BF16": 28, "I64": 1}, "float"), ({"I64": 1}, None), ({}, None)])
def test_precision_class_is_the_weakest_tensor_type(types: dict, expected: str | None) -> None:
    assert precision_class(types) == expected


def test_the_gate_is_the_weaker_files_default_or_what_is_given() -> None:
    f, q8, q4 = {"BF16": 1}, {"Q8_0": 1}, {"Q4_K": 1}
    assert resolve_gate(f, f, None, None, True, True) == Gate(0.99, 0.01, None, "float")
    assert resolve_gate(f, q8, None, None, True, True) == Gate(0.97, 0.02, None, "8-bit")
    assert resolve_gate(f, f, None, None, False, True) == Gate(None, None, DEFAULT_GATES["float"].cosine, "float")
    assert resolve_gate(f, q4, None, None, True, True).source == "below 8 bits"
    assert resolve_gate(f, f, 0.5, None, True, True) == Gate(0.5, None, None, "given")
    assert resolve_gate(f, f, None, None, True, False) == Gate()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate")
    shipped = root / "shipped"
    shutil.copytree(LONG / "drafter", shipped)
    config = json.loads((shipped / "config.json").read_text())
    del config["is_causal"]
    (shipped / "config.json").write_text(json.dumps(config))
    out = {"shipped": shipped}
    for name, src in (("kept", LONG / "drafter"), ("lost", shipped)):
        out[name] = root / f"{name}.gguf"
        res = CliRunner().invoke(convert_command, [str(src), str(out[name]), "--target", str(LONG / "target"),
                                                   "--outtype", "bf16", "-q"])
        assert res.exit_code == 0, res.output
    for t in ("Q8_0", "Q4_K_M"):
        out[t] = root / f"kept-{t}.gguf"
        res = CliRunner().invoke(quantize_command, [str(out["kept"]), str(out[t]), t, "-q"])
        assert res.exit_code == 0, res.output
    return out


def _parity(*args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(parity_command, [*args, "--rounds", "4", "--skip-weights", "--format", "json"])
    return res.exit_code, json.loads(res.stdout)


def _field(report: dict, key: str):  # type: ignore[no-untyped-def]
    return report["summary"][key]


def test_a_file_that_loses_the_checkpoints_meaning_fails_at_the_defaults(files: dict[str, Path]) -> None:
    code, report = _parity(str(files["shipped"]), str(files["lost"]), "--target", str(LONG / "target"))
    assert code == 1
    top1, kl = _field(report, "top1"), _field(report, "kl")[0]
    assert report["status"] == (
        f"top-1 agreement {top1:.2%} < 99.00%; mean KL {kl:.3g} > 0.01 (the default for float files: "
        f"--threshold-top1 / --threshold-kl sets another, --no-default-gate none); {CAUSE}")
    assert _field(report, "gate") == "top-1 ≥ 99.00%, KL ≤ 0.01 (default for float files)"
    # without a target head: the output hidden states' cosine, the same default, the same cause
    code, report = _parity(str(files["shipped"]), str(files["lost"]))
    assert code == 1 and report["status"].startswith("output hidden-state cosine ")
    assert "< 0.999 (the default for float files: --target with --threshold-top1 sets another" in report["status"]
    assert report["status"].endswith(CAUSE)
    code, report = _parity(str(files["shipped"]), str(files["lost"]), "--no-default-gate")
    assert code == 0 and _field(report, "gate") == "none"


@pytest.mark.parametrize("candidate, gate", [("kept", "top-1 ≥ 99.00%, KL ≤ 0.01 (default for float files)"),
                                             ("Q8_0", "top-1 ≥ 97.00%, KL ≤ 0.02 (default for 8-bit files)")])
def test_a_file_that_keeps_it_passes_at_the_defaults(files: dict[str, Path], candidate: str, gate: str) -> None:
    code, report = _parity(str(LONG / "drafter"), str(files[candidate]), "--target", str(LONG / "target"))
    assert code == 0, report["status"]
    assert _field(report, "gate") == gate and _field(report, "top1") >= 0.97


def test_below_8_bits_there_is_no_default(files: dict[str, Path]) -> None:
    code, report = _parity(str(LONG / "drafter"), str(files["Q4_K_M"]), "--target", str(LONG / "target"))
    assert code == 0 and _field(report, "top1") < 0.99  # it loses some, and that is the publisher's call
    assert _field(report, "gate") == "none: no default below 8 bits — give --threshold-top1 / --threshold-kl"
    code, report = _parity(str(LONG / "drafter"), str(files["Q4_K_M"]), "--target", str(LONG / "target"),
                           "--threshold-top1", "99%")
    assert code == 1 and report["status"].startswith("top-1 agreement ") and "< --threshold-top1 99.00%" in \
        report["status"]
