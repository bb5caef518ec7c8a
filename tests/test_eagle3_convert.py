"""EAGLE-3 drafters (issue 57): every layout in circulation converts byte-identically to llama.cpp's own converter
(``convert_hf_to_gguf.py --target-model-dir``, both pinned builds), and what llama.cpp refuses — or converts into
a file that drafts another model — is refused by name, exit 1, nothing written.

The fixtures are written by ``fixtures/make_eagle3.py`` with the projects' own classes (speculators 0.9.0's
``Eagle3DraftModel``) or, for the layouts no installable package writes, by hand in their published names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflashkit.cli.convert import convert_command
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError
from llama_cpp_oracle import BUILDS, OracleError, compare_gguf, require_llama_cpp_src, run_oracle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_eagle3  # noqa: E402

pytest.importorskip("speculators.models.eagle3")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    return make_eagle3.make(tmp_path_factory.mktemp("eagle3"))


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("name", make_eagle3.ACCEPTED)
def test_conversion_is_byte_identical_to_llama_cpps_converter(build: str, name: str, made: tuple[Path, dict[str, Path]],
                                                              tmp_path: Path) -> None:
    src = require_llama_cpp_src(build)
    target, fixtures = made
    for outtype in ("f32", "f16", "bf16", "q8_0"):
        theirs = run_oracle(fixtures[name], tmp_path / f"theirs-{outtype}.gguf", outtype=outtype, target_dir=target,
                            src=src)
        ours = convert(fixtures[name], tmp_path / f"ours-{outtype}.gguf", outtype=outtype, target=target,
                       progress=False, warn=lambda _: None)
        assert ours.architecture == "eagle3"
        assert compare_gguf(ours.out, theirs) == [], (name, outtype)
        assert ours.out.read_bytes() == theirs.read_bytes(), (name, outtype)


def _convert_cli(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(convert_command, args)
    return res.exit_code, res.output


# what llama.cpp does with each refused fixture (its converter: the message, or None when it writes a file anyway)
REFUSALS = {
    "refused-qwen3-layer": ("tensor 'layers.0.self_attn.k_norm.weight' — a Qwen3-style decoder layer normalises q and "
                            "k per head", "Can not map tensor 'model.layers.0.self_attn.k_norm.weight'"),
    "refused-fc-norm": ("fc_norm: true — per-tap RMSNorms before fc", "Can not map tensor 'fc_norm.0.weight'"),
    "refused-norm-output": ("norm_output: true — the drafter feeds its normed state back, llama.cpp the pre-norm "
                            "state", None),
    "refused-two-layers": ("num_hidden_layers 2 — llama.cpp tells an EAGLE-3 drafter by one decoder layer",
                           "Can not map tensor 'd2t'"),
    "refused-four-taps": ("'eagle_aux_hidden_state_layer_ids' lists 4 target layers — llama.cpp's EAGLE-3 graph "
                          "fuses exactly 3", None),
    "refused-attention-bias": ("attention_bias: true — llama.cpp's EAGLE-3 layer has no biases", None),
    "refused-gelu": ("hidden_act 'gelu' — llama.cpp's EAGLE-3 layer runs SiLU only", None),
    "refused-d2t-out-of-range": ("d2t target ids out of range for target vocab size 512 (1 of 256; first: row 255 → "
                                 "512)", "EAGLE-3 d2t target ids out of range for target vocab size 512"),
    "refused-d2t-duplicate": ("d2t contains duplicate target ids (target id", "EAGLE-3 d2t contains duplicate target ids"),
}


def test_every_refused_fixture_has_a_refusal() -> None:
    assert set(REFUSALS) == set(make_eagle3.REFUSED)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_what_llama_cpp_cannot_run_is_refused_by_name(name: str, made: tuple[Path, dict[str, Path]],
                                                      tmp_path: Path) -> None:
    target, fixtures = made
    out = tmp_path / "out.gguf"
    code, output = _convert_cli([str(fixtures[name]), str(out), "--target", str(target)])
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), output
    assert REFUSALS[name][0] in lines[0], lines[0]
    assert str(fixtures[name]) in lines[0]  # names the checkpoint
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_llama_cpps_converter_on_the_refused_fixtures(name: str, made: tuple[Path, dict[str, Path]],
                                                      tmp_path: Path) -> None:
    """Why each refusal: llama.cpp's converter stops with the message above, or writes a file that its graph runs as
    another model (or cannot load) — a file dflashkit never writes."""
    target, fixtures = made
    expected = REFUSALS[name][1]
    if expected is None:
        run_oracle(fixtures[name], tmp_path / "o.gguf", outtype="f32", target_dir=target)
        return
    with pytest.raises(OracleError) as err:
        run_oracle(fixtures[name], tmp_path / "o.gguf", outtype="f32", target_dir=target)
    assert expected in str(err.value)


def test_an_eagle3_drafter_needs_its_target(made: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    _, fixtures = made
    code, output = _convert_cli([str(fixtures["speculators-llama"]), str(tmp_path / "o.gguf")])
    assert code == 1 and output.strip() == (
        f"error: {fixtures['speculators-llama']}: a speculators EAGLE-3 drafter converts with its target: pass --target "
        "TARGET_HF_DIR or TARGET.gguf (llama.cpp's converter reads its vocabulary, hidden size, layer count and "
        "tokenizer from --target-model-dir)")


def test_an_eagle3_drafter_has_one_dialect(made: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    target, fixtures = made
    with pytest.raises(DFlashError, match=r"speculators-llama: EAGLE-3 drafters have one GGUF dialect, llama.cpp's "
                                          r"\(architecture 'eagle3'\): use --dialect llama.cpp$"):
        convert(fixtures["speculators-llama"], tmp_path / "o.gguf", target=target, dialect="luce", progress=False)


def test_a_target_of_another_width_is_refused(made: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    """fc reads 3 × 64 features; a target of hidden size 256 is another model's (the drafter ↔ target rule table)."""
    _, fixtures = made
    trained_target = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "target"
    with pytest.raises(DFlashError, match=r"target hidden size 256 ≠ drafter hidden_size 64"):
        convert(fixtures["speculators-llama"], tmp_path / "o.gguf", target=trained_target, progress=False)
    assert not (tmp_path / "o.gguf").exists()
