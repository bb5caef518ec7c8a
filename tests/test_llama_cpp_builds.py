"""Where the pinned llama.cpp builds differ (0.3.36 and mainline b11549), what dflashkit does, and what it says.

1. A DFlash drafter whose target is a Gemma model and whose config gives no ``input_embedding_scale``: mainline's
   converter writes ``dflash.embedding_scale = √hidden_size``, 0.3.36 writes no key. dflash-convert follows mainline
   (byte-identical to it), says so in a warning, and ``--embedding-scale`` overrides; dflash-inspect names a file
   without the key for a Gemma target.
2. A Gemma-4 DSpark drafter without ``lm_head.weight`` and ``tie_word_embeddings: true``: 0.3.36 converts it (its
   file has ``token_embd`` and no ``output``; its loader tied the head), mainline refuses it, and its loader would
   run such a file with the target's head. dflash-convert refuses it as mainline does; dflash-inspect names such a
   file (``drafter.tied_head``).

The target of case 1 is the trained target relabelled ``Gemma3ForCausalLM``: mainline decides by the target's
architecture, and a Gemma3 target without ``tokenizer.model`` takes the same BPE vocabulary path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dflashkit.cli import convert_command, inspect_command
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError, UsageError
from dflashkit.io.gguf_reader import open_gguf
from llama_cpp_oracle import OracleError, compare_gguf, require_llama_cpp_src, run_oracle

# slow: both llama.cpp builds run on every fixture
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"


@pytest.fixture(scope="module")
def gemma_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = shutil.copytree(TRAINED / "target", tmp_path_factory.mktemp("gemma") / "target")
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["Gemma3ForCausalLM"]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _scale(path: Path) -> tuple[str, float] | None:
    with open_gguf(path) as g:
        kv = g.kvs.get("dflash.embedding_scale")
        return None if kv is None else (kv.type.name, float(kv.value))


def test_a_gemma_target_gets_the_square_root_scale_and_a_warning(gemma_target: Path, tmp_path: Path) -> None:
    said: list[str] = []
    out = convert(TRAINED / "drafter", tmp_path / "d.gguf", outtype="bf16", target=gemma_target, progress=False,
                  warn=said.append).out
    assert _scale(out) == ("FLOAT32", 16.0)  # √256, the target's hidden size
    assert said[0].startswith(f"{TRAINED / 'drafter'}: dflash.embedding_scale = 16 (√256): the target "
                              "Gemma3ForCausalLM is a Gemma model and the config gives no input_embedding_scale; "
                              "mainline llama.cpp's converter (b11549")
    assert said[0].endswith("pass --embedding-scale 1 for a drafter trained on unscaled embeddings")
    # a Qwen target: no key, no word
    said.clear()
    plain = convert(TRAINED / "drafter", tmp_path / "p.gguf", outtype="bf16", target=TRAINED / "target",
                    progress=False, warn=said.append).out
    assert _scale(plain) is None and said == []


def test_embedding_scale_overrides(gemma_target: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(convert_command, [str(TRAINED / "drafter"), str(tmp_path / "one.gguf"), "--target",
                                               str(gemma_target), "--embedding-scale", "1", "-q"])
    assert res.exit_code == 0, res.output
    assert _scale(tmp_path / "one.gguf") == ("FLOAT32", 1.0)
    res = CliRunner().invoke(convert_command, [str(TRAINED / "drafter"), str(tmp_path / "x.gguf"), "--target",
                                               str(TRAINED / "target"), "--embedding-scale", "0"])
    assert res.exit_code == 2 and "Invalid value for '--embedding-scale'" in res.output
    with pytest.raises(UsageError, match="--embedding-scale applies when converting a checkpoint"):
        convert(tmp_path / "one.gguf", tmp_path / "y.gguf", embedding_scale=2.0, progress=False)


def test_gemma_scale_byte_identical_to_mainline_and_one_key_from_0336(gemma_target: Path, tmp_path: Path) -> None:
    ours = convert(TRAINED / "drafter", tmp_path / "ours.gguf", outtype="bf16", target=gemma_target, progress=False,
                   warn=lambda m: None).out
    require_llama_cpp_src("b11549")
    mainline = run_oracle(TRAINED / "drafter", tmp_path / "b11549.gguf", outtype="bf16", target_dir=gemma_target,
                          build="b11549")
    assert ours.read_bytes() == mainline.read_bytes()
    require_llama_cpp_src("0.3.36")
    old = run_oracle(TRAINED / "drafter", tmp_path / "0.3.36.gguf", outtype="bf16", target_dir=gemma_target)
    assert compare_gguf(old, ours, ordered=True) == ["metadata dflash.embedding_scale: only in b"]


def test_inspect_names_a_missing_gemma_scale(gemma_target: Path, tmp_path: Path) -> None:
    unscaled = convert(TRAINED / "drafter", tmp_path / "u.gguf", outtype="bf16", target=TRAINED / "target",
                       progress=False, warn=lambda m: None).out  # as llama.cpp 0.3.36 writes it for a Gemma target
    res = CliRunner().invoke(inspect_command, [str(unscaled), "--target", str(gemma_target), "--json"])
    found = {f["id"]: f for f in json.loads(res.stdout)["files"][0]["findings"]}
    assert found["target.gemma_embedding_scale"]["severity"] == "warning"
    assert "no embedding_scale for the Gemma target Gemma3ForCausalLM" in found["target.gemma_embedding_scale"]["message"]
    assert "scale by 16" in found["target.gemma_embedding_scale"]["message"]
    scaled = convert(TRAINED / "drafter", tmp_path / "s.gguf", outtype="bf16", target=gemma_target, progress=False,
                     warn=lambda m: None).out
    res = CliRunner().invoke(inspect_command, [str(scaled), "--target", str(gemma_target), "--json"])
    assert "target.gemma_embedding_scale" not in {f["id"] for f in json.loads(res.stdout)["files"][0]["findings"]}


@pytest.fixture(scope="module")
def tied_gemma4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The zoo's Gemma-4 DSpark drafter with its head tied: embed_tokens.weight in place of lm_head.weight."""
    pytest.importorskip("dflash.model")
    import make_zoo

    root = tmp_path_factory.mktemp("tied")
    target = make_zoo.make_target_dir(root)
    made = make_zoo.make_fixture(root, "gemma4-dspark", target)
    weights = made / "model.safetensors"
    tensors = load_file(weights)
    tensors["embed_tokens.weight"] = tensors.pop("lm_head.weight")
    save_file(tensors, weights, metadata={"format": "pt"})
    config = json.loads((made / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (made / "config.json").write_text(json.dumps(config, indent=2))
    return target, made


def test_a_tied_gemma4_dspark_is_refused_as_mainline_refuses_it(tied_gemma4: tuple[Path, Path], tmp_path: Path) -> None:
    target, made = tied_gemma4
    with pytest.raises(DFlashError) as ours:
        convert(made, tmp_path / "ours.gguf", target=target, progress=False, warn=lambda m: None)
    assert str(ours.value) == (
        f"{made}: Gemma4 DSpark requires lm_head.weight — mainline llama.cpp refuses a drafter without it even with "
        "tie_word_embeddings: true (its loader would run the file with the target's head); add lm_head.weight (a copy "
        "of embed_tokens.weight for a tied drafter)")
    assert not (tmp_path / "ours.gguf").exists()
    require_llama_cpp_src("b11549")
    with pytest.raises(OracleError) as theirs:
        run_oracle(made, tmp_path / "b11549.gguf", target_dir=target, build="b11549")
    assert theirs.value.message == "ValueError: Gemma4 DSpark requires lm_head.weight"


def test_inspect_names_a_tied_head_that_only_0336_ties(tied_gemma4: tuple[Path, Path], tmp_path: Path) -> None:
    target, made = tied_gemma4
    require_llama_cpp_src("0.3.36")
    old = run_oracle(made, tmp_path / "0.3.36.gguf", target_dir=target)  # 0.3.36 converts it
    with open_gguf(old) as g:
        assert "token_embd.weight" in g.tensors and "output.weight" not in g.tensors
    res = CliRunner().invoke(inspect_command, [str(old), "--json"])
    found = {f["id"]: f for f in json.loads(res.stdout)["files"][0]["findings"]}
    assert found["drafter.tied_head"]["severity"] == "warning"
    assert found["drafter.tied_head"]["message"] == (
        f"{old}: token_embd.weight but no output.weight — llama.cpp 0.3.36 ties the drafter's head to its own "
        "token_embd, mainline llama.cpp (b11549) no longer does and runs this file with the target's head; add "
        "output.weight (a copy of token_embd.weight) by converting a checkpoint with lm_head.weight")
