"""dflash-imatrix (issue 40): the first importance matrix a DFlash drafter can have, from its real draft rounds on
its target's hidden states — in llama-imatrix's GGUF format, named as the drafter's GGUF names its tensors, taken
by the real llama-quantize --imatrix of both pinned builds, and giving exactly its bytes through dflash-quantize."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dflashkit.cli import imatrix_command
from dflashkit.converters.convert import convert
from dflashkit.io.gguf_reader import open_gguf
from dflashkit.quantize.gguf_file import quantize_gguf
from dflashkit.quantize.imatrix_read import load_imatrix

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
QUIET = dict(progress=False, warn=lambda m: None)
BUILDS = [("0.3.36", "DFLASHKIT_LLAMA_CPP_BIN"), ("b11549", "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN")]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("imatrix")
    out = folder / "drafter.imatrix.gguf"
    res = CliRunner().invoke(imatrix_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"),
                                               "--prompts", str(TRAINED / "prompts.jsonl"), "--max-prompts", "4",
                                               "--max-new-tokens", "32", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    f32 = folder / "f32.gguf"
    convert(TRAINED / "drafter", f32, outtype="f32", target=TRAINED / "target", **QUIET)
    return out, f32


def test_the_file_is_llama_imatrixs_format_named_as_the_drafter(made: tuple[Path, Path]) -> None:
    im, f32 = made
    with open_gguf(f32) as g:
        weights = sorted(n for n, t in g.tensors.items() if len(t.dims) == 2 and "norm" not in n)
        widths = {n: g.tensors[n].dims[0] for n in weights}
    with open_gguf(im) as g:
        assert g.get("general.type") == "imatrix" and g.get("imatrix.datasets") == ["prompts.jsonl"]
        assert g.get("imatrix.chunk_size") == 16 and g.get("imatrix.chunk_count") > 4  # draft rounds
        assert sorted(n[: -len(".in_sum2")] for n in g.tensors if n.endswith(".in_sum2")) == weights
        for n in weights:
            sums, counts = np.array(g.array(f"{n}.in_sum2")), np.array(g.array(f"{n}.counts"))
            assert sums.shape == (1, widths[n]) and counts.shape == (1, 1) and counts[0, 0] > 0
            assert (sums > 0).all() and np.isfinite(sums).all()
    m = load_imatrix(im)
    # fc sees the target's concatenated hidden states, the projections the drafter's own: different statistics
    assert m.weights["fc.weight"].size == 512 and m.weights["blk.0.attn_q.weight"].size == 256


@pytest.mark.slow
@pytest.mark.parametrize("build, var", BUILDS)
@pytest.mark.parametrize("ftype", ["IQ4_XS", "Q2_K", "Q4_0", "Q3_K_S", "Q4_K_M"])
def test_llama_quantize_takes_it_and_writes_our_bytes(made: tuple[Path, Path], build: str, var: str, ftype: str,
                                                      tmp_path: Path) -> None:
    im, f32 = made
    binary = Path(os.environ.get(var, "/nonexistent")) / "llama-quantize"
    if not binary.exists():
        pytest.skip(f"set {var} to the bin/ folder of the llama.cpp {build} build (.ci/run builds it)")
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    r = subprocess.run([str(binary), "--imatrix", str(im), str(f32), str(ref), ftype], capture_output=True,
                       text=True, errors="replace", timeout=300)
    assert r.returncode == 0 and "loaded 15 importance matrix entries" in r.stdout + r.stderr, r.stderr[-1500:]
    quantize_gguf(f32, ours, ftype, imatrix=im, **QUIET)
    assert ours.read_bytes() == ref.read_bytes()


def test_usage_and_input_errors(made: tuple[Path, Path], tmp_path: Path) -> None:
    im, f32 = made
    runner = CliRunner()
    res = runner.invoke(imatrix_command, [str(TRAINED / "drafter"), "--target", str(f32), "-o",
                                          str(tmp_path / "x.gguf")])
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        f"error: --target {f32}: give the target's HF model folder (its hidden states feed the drafter)"]
    res = runner.invoke(imatrix_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"), "-o", str(im)])
    assert res.exit_code == 1 and f"{im}: already exists — pass --force" in res.output
    res = runner.invoke(imatrix_command, [str(TRAINED / "drafter"), "--target", str(TRAINED / "target"), "-o",
                                          str(TRAINED / "drafter" / "config.json"), "--force"])
    assert res.exit_code == 2 and "is also an input" in res.output
