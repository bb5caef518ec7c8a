"""The audit's window rows (`dflashkit.divergences.windows`, docs/causality.md): each planted in a checkpoint,
converted, named in one warning, and — where the GGUF runs otherwise in llama.cpp than the checkpoint in its
reference — the loss measured by ``dflash-parity CHECKPOINT FILE.gguf`` with the row named as the likely cause.
The window keys dflashkit writes from ``layer_types`` are checked against llama.cpp's own converter (both builds),
which writes none for such a config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner

from dflashkit.cli import convert_command, parity_command
from dflashkit.runtime import load_drafter

ROOT = Path(__file__).resolve().parents[1]
TRAINED, LONG = ROOT / "fixtures" / "trained", ROOT / "fixtures" / "trained-long"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _plant(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def _convert(src: Path, out: Path, target: Path, *extra: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(convert_command, [str(src), str(out), "--target", str(target), *extra])


def _parity(checkpoint: Path, gguf_path: Path, target: Path) -> tuple[int, str]:
    res = CliRunner().invoke(parity_command, [str(checkpoint), str(gguf_path), "--target", str(target), "--rounds",
                                              "3", "--skip-weights", "--format", "json"])
    return res.exit_code, json.loads(res.stdout)["status"]


WINDOW_KEYS = ("sliding_window: written from layer_types (window 128 on layers 0, 1, 2) though use_sliding_window is "
               "false — llama.cpp's own converter writes no window keys for this config (its file runs every layer "
               "unwindowed) and transformers' Qwen3Config drops the window at load; dflashkit keeps the window the "
               "layer types name, and llama.cpp runs it (docs/causality.md)")


def test_window_keys_from_layer_types_are_said_and_llama_cpps_converter_writes_none(tmp_path: Path) -> None:
    out = tmp_path / "long.gguf"
    res = _convert(LONG / "drafter", out, LONG / "target")
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [f"warning: {LONG / 'drafter' / 'config.json'}: {WINDOW_KEYS}"]
    fields = gguf.GGUFReader(out).fields
    assert int(fields["dflash.attention.sliding_window"].parts[-1][0]) == 128
    # --strict keeps the file: no meaning is lost (llama.cpp runs the window the layer types name)
    assert _convert(LONG / "drafter", tmp_path / "strict.gguf", LONG / "target", "--strict").exit_code == 0


@pytest.mark.parametrize("build", ["0.3.36", "b11549"])
def test_llama_cpps_converter_writes_no_window_keys_for_that_config(build: str, tmp_path: Path) -> None:
    from llama_cpp_oracle import require_llama_cpp_src, run_oracle

    theirs = run_oracle(LONG / "drafter", tmp_path / "theirs.gguf", outtype="bf16", target_dir=LONG / "target",
                        src=require_llama_cpp_src(build))
    keys = set(gguf.GGUFReader(theirs).fields)
    assert "dflash.attention.sliding_window" not in keys and "dflash.attention.sliding_window_pattern" not in keys


def _speculators_sliding(config: dict) -> None:
    layer = config["transformer_layer_config"]
    layer.update(layer_types=["sliding_attention", "full_attention"], sliding_window=6, use_sliding_window=True)
    config["sliding_window_non_causal"] = True  # bidirectional sliding layer: only the window's counting differs


def test_speculators_window_from_the_anchor_is_said_and_its_loss_measured(tmp_path: Path) -> None:
    planted = _plant(TRAINED / "drafter-speculators", tmp_path / "spec-sliding", _speculators_sliding)
    out = tmp_path / "spec.gguf"
    res = _convert(planted, out, TRAINED / "target")
    assert res.exit_code == 0, res.output
    line = (f"warning: {planted / 'config.json'}: sliding_window (from the anchor): the reference shows a sliding "
            "layer the 6 context positions before the block's anchor, the same for every slot; llama.cpp "
            "counts the window per query, so draft slot i sees 6 − 1 − i of them (the drafts differ once the context "
            "passes the window) (docs/causality.md)")
    assert line in res.stderr.splitlines()
    assert _convert(planted, tmp_path / "strict.gguf", TRAINED / "target", "--strict").exit_code == 1
    assert not (tmp_path / "strict.gguf").exists()
    assert load_drafter(planted).spec.window_from_anchor and not load_drafter(out).spec.window_from_anchor
    code, status = _parity(planted, out, TRAINED / "target")
    assert code == 1 and "likely cause: " in status and "sliding_window (from the anchor): the reference" in status


def _short_window(config: dict) -> None:
    config.update(layer_types=["sliding_attention", "full_attention"], sliding_window=4, use_sliding_window=True,
                  is_causal=False)


def test_a_window_shorter_than_the_block_is_said_and_its_loss_measured(tmp_path: Path) -> None:
    planted = _plant(TRAINED / "drafter", tmp_path / "short-window", _short_window)
    out = tmp_path / "short.gguf"
    res = _convert(planted, out, TRAINED / "target")
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [
        f"warning: {planted / 'config.json'}: sliding_window: window 4 is shorter than the block (16) on "
        "bidirectional sliding layers 0: the reference hides block positions 4 or more ahead of a query too; "
        "llama.cpp masks only the past side, so those layers see the whole block ahead (docs/causality.md)"]
    assert _convert(planted, tmp_path / "strict.gguf", TRAINED / "target", "--strict").exit_code == 1
    model = load_drafter(out)
    assert model.spec.llama_cpp_rules and model.spec.llama_cpp_masks
    # the mask llama.cpp builds (is_masked_swa: hidden iff p_query − p_key ≥ 4; nothing ahead hidden) against the
    # reference's symmetric one, written here from their definitions
    import torch

    q = torch.arange(8)[:, None]
    k = torch.arange(8)[None, :]
    llama = (q - k) < 4
    reference = ((q - k) < 4) & ((k - q) < 4)
    assert bool((llama & ~reference).any())  # llama.cpp shows keys 4+ ahead the reference hides
    code, status = _parity(planted, out, TRAINED / "target")
    assert code == 1 and "likely cause: " in status and "window 4 is shorter than the block" in status


def test_no_window_row_fires_on_the_committed_pairs_but_the_long_pairs_keys() -> None:
    from dflashkit.divergences import divergences, hf_config
    from dflashkit.drafters import open_drafter

    for path, expected in ((TRAINED / "drafter", []), (TRAINED / "drafter-speculators", []),
                           (LONG / "drafter", ["window-keys"])):
        with open_drafter(path) as d:
            assert [x.rule.id for x in divergences(d.spec, hf_config(path))] == expected, path


@pytest.mark.parametrize("max_window_layers, pattern", [(1, (False, True)), (None, None)])
def test_without_layer_types_the_sliding_layers_are_qwen3configs(tmp_path: Path, max_window_layers: int | None,
                                                                 pattern: tuple | None) -> None:
    """use_sliding_window and no layer_types: Qwen3Config makes layers from max_window_layers (default 28) on sliding —
    none of a 2-layer drafter's by default — and so does dflashkit (it once windowed every layer)."""
    from transformers import Qwen3Config

    from dflashkit.drafters import open_drafter

    def edit(config: dict) -> None:
        config.pop("layer_types", None)
        config.update(use_sliding_window=True, sliding_window=4)
        config.pop("max_window_layers", None)
        if max_window_layers is not None:
            config["max_window_layers"] = max_window_layers

    planted = _plant(TRAINED / "drafter", tmp_path / "derived", edit)
    expected = tuple(t == "sliding_attention" for t in Qwen3Config.from_pretrained(planted).layer_types)
    with open_drafter(planted) as d:
        assert d.spec.sliding_window_pattern == pattern
    assert (pattern or (False, False)) == expected
