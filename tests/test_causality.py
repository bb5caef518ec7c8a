"""One file, one meaning (issue 55): per-layer causality, as a reference runs a checkpoint and as llama.cpp runs its
GGUF. The planted checkpoint is the long pair's drafter (3 sliding layers, 1 full) with ``is_causal`` removed, as a
publisher ships one: z-lab runs its sliding layers causal, llama.cpp's one flag (absent) runs none of them.

Oracles: z-lab's ``dflash`` model for the checkpoint's rule, llama.cpp's own converter (its GGUF carries no record,
and inspect must still name it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner

from dflashkit.cli import convert_command, inspect_command, parity_command
from dflashkit.runtime import load_drafter

ROOT = Path(__file__).resolve().parents[1]
LONG = ROOT / "fixtures" / "trained-long"

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LOST = ("per-layer causality is lost: the reference runs layers 0, 1, 2 causal and 3 bidirectional; llama.cpp reads "
        "one flag for every layer (dflash.attention.causal: absent, so false) and will run every layer bidirectional")
FIX = "choose llama.cpp's flag with --llama-cpp-causal true|false (docs/causality.md)"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The long pair's drafter as a publisher ships it without is_causal."""
    out = tmp_path_factory.mktemp("shipped") / "drafter"
    shutil.copytree(LONG / "drafter", out)
    config = json.loads((out / "config.json").read_text())
    assert config.pop("is_causal") is False and config["layer_types"][:3] == ["sliding_attention"] * 3
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _fields(path: Path) -> dict[str, list]:
    reader = gguf.GGUFReader(path)
    return {k: [f.parts[i].tolist()[0] for i in f.data] for k, f in reader.fields.items()
            if k in ("dflash.attention.causal", "dflashkit.attention.causal_layers")}


@pytest.fixture(scope="module")
def converted(shipped: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "drafter.gguf"
    res = CliRunner().invoke(convert_command, [str(shipped), str(out), "--target", str(LONG / "target")])
    assert res.exit_code == 0, res.output
    causal, window = res.stderr.splitlines()  # the window keys' line: tests/test_divergences_windows.py
    assert causal == (f"warning: {shipped / 'config.json'}: {LOST} — the reference's rule is recorded in "
                      f"dflashkit.attention.causal_layers; {FIX}")
    assert window.startswith(f"warning: {shipped / 'config.json'}: sliding_window: written from layer_types")
    return out


def test_convert_warns_records_the_rule_and_writes_llama_cpps_flag_as_its_converter(converted: Path) -> None:
    assert _fields(converted) == {"dflashkit.attention.causal_layers": [True, True, True, False]}


def test_strict_refuses_and_writes_nothing(shipped: Path, tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    res = CliRunner().invoke(convert_command, [str(shipped), str(out), "--target", str(LONG / "target"), "--strict"])
    assert res.exit_code == 1 and not out.exists() and not list(tmp_path.iterdir())
    assert res.stderr.splitlines() == [f"error: {shipped / 'config.json'}: per-layer causality would be lost: "
                                       f"{LOST.split(': ', 1)[1]} — refusing under --strict; {FIX}"]


def test_the_publisher_chooses_the_flag(shipped: Path, tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    res = CliRunner().invoke(convert_command, [str(shipped), str(out), "--target", str(LONG / "target"),
                                               "--llama-cpp-causal", "TRUE"])
    assert res.exit_code == 0, res.output
    assert "(dflash.attention.causal: true) and will run every layer causal" in res.stderr
    assert _fields(out) == {"dflash.attention.causal": [True], "dflashkit.attention.causal_layers": [True, True, True,
                                                                                                     False]}
    assert all(layer.self_attn.causal for layer in load_drafter(out).layers)
    res = CliRunner().invoke(convert_command, [str(shipped), str(tmp_path / "l.gguf"), "--dialect", "luce",
                                               "--llama-cpp-causal", "false"])
    assert res.exit_code == 2 and res.stderr.splitlines() == [
        "error: --llama-cpp-causal sets llama.cpp's dflash.attention.causal: give it with --dialect llama.cpp"]


def test_a_checkpoint_trained_as_llama_cpp_runs_it_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    res = CliRunner().invoke(convert_command, [str(LONG / "drafter"), str(out), "--target", str(LONG / "target")])
    assert res.exit_code == 0 and "per-layer causality" not in res.stderr, res.output
    assert [line.split(": ", 3)[2] for line in res.stderr.splitlines()] == ["sliding_window"]  # the window keys' line
    assert _fields(out) == {"dflash.attention.causal": [False]}


def test_the_runtime_runs_the_checkpoint_by_its_rule_and_the_gguf_as_llama_cpp(shipped: Path,
                                                                                converted: Path) -> None:
    assert [layer.self_attn.causal for layer in load_drafter(shipped).layers] == [True, True, True, False]
    assert [layer.self_attn.causal for layer in load_drafter(converted).layers] == [False] * 4


def test_the_checkpoints_rule_is_z_labs(shipped: Path) -> None:
    """The rule the runtime applies to the checkpoint is the one z-lab's own model applies to its config."""
    from dflash import model as zl
    from transformers import Qwen3Config

    reference = zl.DFlashDraftModel(Qwen3Config.from_pretrained(shipped))
    assert [layer.self_attn.is_causal for layer in reference.layers] == [True, True, True, False]


def test_inspect_flags_the_gguf_and_names_the_loss_in_the_checkpoint(shipped: Path, converted: Path) -> None:
    res = CliRunner().invoke(inspect_command, [str(converted), str(shipped), "--format", "json"])
    findings = [f for file in json.loads(res.stdout)["files"] for f in file["findings"]
                if f["id"] == "drafter.causality"]
    assert [(f["severity"], f["message"]) for f in findings] == [
        ("warning", f"{converted}: {LOST}; the reference's rule is as recorded in dflashkit.attention.causal_layers "
                    "— llama.cpp runs this file as another model than its checkpoint; choose llama.cpp's flag when "
                    "converting: dflash-convert --llama-cpp-causal true|false (docs/causality.md)"),
        ("info", f"{shipped}: converted for llama.cpp, per-layer causality would be lost: {LOST.split(': ', 1)[1]}; "
                 "choose llama.cpp's flag when converting: dflash-convert --llama-cpp-causal true|false "
                 "(docs/causality.md)"),
    ]


def test_inspect_flags_llama_cpps_own_conversion(shipped: Path, tmp_path: Path) -> None:
    """llama.cpp's converter writes no record (and no causal key): inspect infers the references' rule from the
    window keys — which that converter writes only when the config sets use_sliding_window (without it the file
    says nothing of its sliding layers, and nothing can be inferred)."""
    from llama_cpp_oracle import run_oracle

    windowed = tmp_path / "windowed"
    shutil.copytree(shipped, windowed)
    config = json.loads((windowed / "config.json").read_text())
    (windowed / "config.json").write_text(json.dumps({**config, "use_sliding_window": True}))
    out = run_oracle(windowed, tmp_path / "llama.gguf", outtype="bf16", target_dir=LONG / "target")
    assert _fields(out) == {}
    res = CliRunner().invoke(inspect_command, [str(out), "--format", "json"])
    findings = [f for f in json.loads(res.stdout)["files"][0]["findings"] if f["id"] == "drafter.causality"]
    assert [f["message"] for f in findings] == [
        f"{out}: {LOST}; the reference's rule is as z-lab, vLLM and SGLang run a checkpoint without is_causal (the "
        "file has no causal key) — llama.cpp runs this file as another model than its checkpoint; choose llama.cpp's "
        "flag when converting: dflash-convert --llama-cpp-causal true|false (docs/causality.md)"]


def test_parity_of_the_checkpoint_and_its_gguf_names_causality(shipped: Path, converted: Path) -> None:
    res = CliRunner().invoke(parity_command, [str(shipped), str(converted), "--target", str(LONG / "target"),
                                              "--rounds", "4", "--skip-weights", "--threshold-top1", "95%",
                                              "--format", "json"])
    assert res.exit_code == 1, res.output
    status = json.loads(res.stdout)["status"]
    assert status.startswith("top-1 agreement ") and status.endswith(
        "< --threshold-top1 95.00%; likely cause: per-layer causality — the reference runs layers 0, 1, 2 causal and 3 "
        "bidirectional, the candidate (as llama.cpp runs the file: one flag for every layer) every layer bidirectional")
    # the same file against the checkpoint told what llama.cpp runs: nothing to name
    told = shipped.parent / "told"
    shutil.copytree(shipped, told)
    config = json.loads((told / "config.json").read_text())
    (told / "config.json").write_text(json.dumps({**config, "is_causal": False}))
    res = CliRunner().invoke(parity_command, [str(told), str(converted), "--target", str(LONG / "target"),
                                              "--rounds", "4", "--skip-weights", "--format", "json"])
    assert res.exit_code == 0 and "likely cause" not in res.stdout
