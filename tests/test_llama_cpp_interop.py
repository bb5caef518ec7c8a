"""Optional interop with a real llama.cpp build: our files load and draft in llama.cpp, and
dflash-quantize writes the same bytes as llama-quantize.

Needs llama.cpp's `llama-quantize` and `llama-speculative-simple` (the source ships in the
llama-cpp-python sdist; see README "Checking against a real llama.cpp"). Point
DFLASHKIT_LLAMA_CPP_BIN at the folder holding them; without it these tests are skipped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import target_for
from dflashkit.converters.convert import convert
from dflashkit.quantize.gguf_file import quantize_gguf

import make_drafters
import make_target

BIN = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_BIN", "/nonexistent"))
QUANTIZE = BIN / "llama-quantize"
SPECULATIVE = BIN / "llama-speculative-simple"
# .ci/run sets DFLASHKIT_LLAMA_CPP_SKIP_REASON (one line) when it could not build llama.cpp
pytestmark = pytest.mark.skipif(
    not (QUANTIZE.exists() and SPECULATIVE.exists()),
    reason=os.environ.get("DFLASHKIT_LLAMA_CPP_SKIP_REASON")
    or "set DFLASHKIT_LLAMA_CPP_BIN to a llama.cpp build with llama-quantize and llama-speculative-simple",
)
QUIET = dict(progress=False, warn=lambda m: None)


def speculative(target: Path, drafter: Path, want: str) -> subprocess.CompletedProcess[str]:
    """Run llama-speculative-simple; rerun (at most 5 runs) while ``want`` is missing from its stderr.

    llama.cpp's logger writes from a worker thread and is deliberately never flushed at exit
    (common/log.cpp, common_log_main: "this design may cause logs to be lost"), so on a busy machine a
    run that exits 0 can lose its last lines, the n_drafted statistics among them. A lost log is a
    rerun, never a pass: every run must still exit as expected, and the assertions read the run that
    printed ``want``."""
    for _ in range(5):
        r = subprocess.run(
            [str(SPECULATIVE), "-m", str(target), "-md", str(drafter), "--spec-type", "draft-dflash",
             "--spec-draft-n-max", "15", "-p", "hello world", "-n", "8", "--temp", "0", "-t", "2", "-c", "256"],
            capture_output=True, text=True, errors="replace", timeout=300,
        )
        if want in r.stderr:
            break
    return r


@pytest.mark.parametrize("family", list(make_drafters.FAMILIES))
def test_llama_cpp_loads_and_drafts(family: str, drafters, targets, tmp_path: Path) -> None:
    target = target_for(family, targets)
    out = tmp_path / "d.gguf"
    convert(drafters[family], out, outtype="q8_0", target=target, **QUIET)
    r = speculative(target, out, want="n_drafted")
    assert r.returncode == 0, r.stderr[-2000:]
    drafted = [line for line in r.stderr.splitlines() if "n_drafted" in line]
    assert drafted and int(drafted[-1].split("=")[-1]) > 0, r.stderr[-2000:]
    assert f"mask_token_id={make_drafters.FAMILIES[family]['dflash_config']['mask_token_id']}" in r.stderr


def test_llama_cpp_refuses_a_drafter_without_tokenizer(drafters, targets, tmp_path: Path) -> None:
    # the failure dflash-convert warns about when --target is missing
    out = tmp_path / "bare.gguf"
    convert(drafters["qwen3-b16"], out, outtype="bf16", **QUIET)
    r = speculative(targets[64]["gguf"], out, want="key not found in model")
    assert r.returncode != 0
    assert "key not found in model: tokenizer.ggml.model" in r.stderr


@pytest.mark.parametrize("family", ["qwen3-b16", "gemma4", "dflash2"])
@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K"])
def test_quantize_is_byte_identical_to_llama_quantize(family: str, ftype: str, tmp_path: Path) -> None:
    # 256-wide rows for the K-quants proper; the 64/72-wide fixtures exercise the fallbacks
    overrides = {}
    if family == "qwen3-b16":
        overrides = dict(hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=5,
                         dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 3, 5, 7, 9]})
    src = make_drafters.make_drafter(tmp_path / "d", family, config_overrides=overrides)
    f16 = tmp_path / "in.gguf"
    convert(src, f16, outtype="bf16", **QUIET)
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    quantize_gguf(f16, ours, ftype, **QUIET)
    r = subprocess.run([str(QUANTIZE), str(f16), str(ref), ftype], capture_output=True, text=True, errors="replace", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert ours.read_bytes() == ref.read_bytes()


def test_tap_past_the_last_layer_aborts_llama_cpp_and_inspect_says_why(drafters, targets, tmp_path: Path) -> None:
    from dflashkit.inspect import inspect_paths

    # same tokenizer as the 12-layer target the drafter was made for, but only 8 layers
    short = make_target.make_gguf_target(
        tmp_path / "short.gguf", make_target.make_hf_target(tmp_path / "short", hidden_size=64, n_layers=8)
    )
    out = tmp_path / "d.gguf"
    convert(drafters["qwen3-b16"], out, outtype="bf16", target=targets[64]["gguf"], **QUIET)  # taps stored [2, 9]
    r = speculative(short, out, want="GGML_ASSERT")
    assert r.returncode != 0 and "GGML_ASSERT" in r.stderr
    report = inspect_paths([str(out)], target=str(short))
    assert "target.tap_range" in {f.id for f in report.files[0].findings}
    assert report.exit_code() == 1
