"""DSpark with a real llama.cpp build (skipped without DFLASHKIT_LLAMA_CPP_BIN): llama-quantize of a DSpark
GGUF equals dflash-quantize of it and dflash-convert straight to the K-quant — which needs llama-quantize's
tensor order (d2t among the globals) and its ggml_n_dims shapes (conf_proj {n_embd + rank, 1} → {n_embd + rank})."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import make_zoo
from dflashkit.converters.convert import convert
from dflashkit.quantize.gguf_file import quantize_gguf

BIN = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_BIN", "/nonexistent"))
QUANTIZE = BIN / "llama-quantize"
pytestmark = pytest.mark.skipif(not QUANTIZE.exists(), reason="set DFLASHKIT_LLAMA_CPP_BIN to a llama.cpp build with llama-quantize")
QUIET = dict(progress=False, warn=lambda m: None)


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q6_K"])
def test_dspark_k_quants_are_byte_identical_to_llama_quantize(ftype: str, tmp_path: Path) -> None:
    pytest.importorskip("speculators.models.dspark")
    target, made = make_zoo.make_zoo(tmp_path / "zoo", ["spec-dspark"])
    f32 = tmp_path / "f32.gguf"
    convert(made["spec-dspark"], f32, outtype="f32", target=target, **QUIET)
    ref = tmp_path / "ref.gguf"
    r = subprocess.run([str(QUANTIZE), str(f32), str(ref), ftype], capture_output=True, text=True, errors="replace", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ours = tmp_path / "ours.gguf"
    quantize_gguf(f32, ours, ftype, **QUIET)
    direct = tmp_path / "direct.gguf"
    convert(made["spec-dspark"], direct, outtype=ftype.lower(), target=target, **QUIET)
    assert ours.read_bytes() == ref.read_bytes()
    assert direct.read_bytes() == ref.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("build, var", [("0.3.36", "DFLASHKIT_LLAMA_CPP_BIN"), ("b11549", "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN")])
def test_dspark_every_new_type_as_llama_quantize_writes_it_and_drafts(build: str, var: str, tmp_path: Path) -> None:
    """Issue 40 for the DSpark family: every new type, without and with an importance matrix, byte-identical to
    llama-quantize of the build, and loaded and drafted by its llama-server."""
    pytest.importorskip("speculators.models.dspark")
    from imatrix_files import weight_tensors, write_gguf_imatrix
    from test_llama_cpp_interop import NEW_TYPES, served

    bin_dir = Path(os.environ.get(var, "/nonexistent"))
    if not (bin_dir / "llama-quantize").exists() or not (bin_dir / "llama-server").exists():
        pytest.skip(f"set {var} to the bin/ folder of the llama.cpp {build} build (.ci/run builds it)")
    import make_target

    target, made = make_zoo.make_zoo(tmp_path / "zoo", ["spec-dspark"])
    target_gguf = make_target.make_gguf_target(tmp_path / "target.gguf", target)
    f32 = tmp_path / "f32.gguf"
    convert(made["spec-dspark"], f32, outtype="f32", target=target, **QUIET)
    imatrix = write_gguf_imatrix(tmp_path / "imatrix.gguf", weight_tensors(f32))
    differ, silent = [], []
    for ftype in NEW_TYPES:
        for im in (None, imatrix):
            ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
            for f in (ours, ref):
                f.unlink(missing_ok=True)
            quantize_gguf(f32, ours, ftype, imatrix=im, **QUIET)
            cmd = [str(bin_dir / "llama-quantize"), *(["--imatrix", str(im)] if im else []), str(f32), str(ref), ftype]
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
            assert r.returncode == 0, r.stderr[-1500:]
            if ours.read_bytes() != ref.read_bytes():
                differ.append(f"{ftype}{' +imatrix' if im else ''}")
        if served(bin_dir, target_gguf, ours)[0] <= 0:
            silent.append(ftype)
    assert differ == [] and silent == [], (differ, silent)
