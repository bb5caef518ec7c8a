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
