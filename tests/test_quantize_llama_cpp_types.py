"""Issue 40: dflash-quantize writes exactly what llama-quantize writes for every type drafters ship in, for every
fixture family, in both pinned llama.cpp builds, without and with an importance matrix (a GGUF one made here by
gguf-py and a legacy .dat, as llama-imatrix writes them) — the mixes, the fallbacks of the narrow fixtures, the
``quantize.imatrix.*`` keys and every byte."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import make_drafters
from dflashkit.converters.convert import convert
from dflashkit.quantize.gguf_file import quantize_gguf
from imatrix_files import weight_tensors, write_gguf_imatrix, write_legacy_imatrix

pytestmark = pytest.mark.slow  # about 40 llama-quantize runs per family and build

BUILDS = [("0.3.36", "DFLASHKIT_LLAMA_CPP_BIN"), ("b11549", "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN")]
NEW_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS"]
#: the types offered before, now also with an importance matrix
IMATRIX_TOO = ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q8_0", "Q2_K_S"]
QUIET = dict(progress=False, warn=lambda m: None)
#: qwen3-b16 at K-quant width (256-wide rows); the other fixtures' 64/72-wide rows exercise every fallback
WIDE = dict(hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=5,
            dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 3, 5, 7, 9]})
#: the fixture families, and qwen3-b16 with 8 heads on 2 kv heads (n_gqa 4: Q2_K / Q2_K_S / IQ4_* give attn_v more)
FIXTURES = {**{f: (f, WIDE if f == "qwen3-b16" else {}) for f in make_drafters.FAMILIES},
            "qwen3-gqa4": ("qwen3-b16", {**WIDE, "head_dim": 32, "num_attention_heads": 8, "num_key_value_heads": 2})}


def _quantize_bin(var: str, build: str) -> Path:
    folder = os.environ.get(var)
    binary = Path(folder or "") / "llama-quantize"
    if not folder or not binary.is_file():
        pytest.skip(f"set {var} to the bin/ folder of the llama.cpp {build} build (.ci/run builds it)")
    return binary


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Path]]:
    """Per family: its bf16 GGUF, a GGUF importance matrix of it and a legacy one."""
    out = {}
    for family, (schema, config) in FIXTURES.items():
        folder = tmp_path_factory.mktemp(family)
        src = make_drafters.make_drafter(folder / "src", schema, config_overrides=config)
        bf16 = folder / "bf16.gguf"
        convert(src, bf16, outtype="bf16", **QUIET)
        entries = weight_tensors(bf16)
        out[family] = (bf16, write_gguf_imatrix(folder / "imatrix.gguf", entries),
                       write_legacy_imatrix(folder / "imatrix.dat", entries))
    return out


@pytest.mark.parametrize("build, var", BUILDS)
@pytest.mark.parametrize("family", list(FIXTURES))
def test_every_type_is_byte_identical_to_llama_quantize(family: str, build: str, var: str, inputs: dict,
                                                        tmp_path: Path) -> None:
    binary = _quantize_bin(var, build)
    bf16, im_gguf, im_legacy = inputs[family]
    cases = [(t, None) for t in NEW_TYPES] + [(t, im_gguf) for t in NEW_TYPES + IMATRIX_TOO]
    cases += [(t, im_legacy) for t in ("Q4_0", "IQ4_XS", "Q3_K_M")]
    differ = []
    for ftype, imatrix in cases:
        ours, ref = tmp_path / f"ours-{ftype}.gguf", tmp_path / f"ref-{ftype}.gguf"
        for f in (ours, ref):
            f.unlink(missing_ok=True)
        quantize_gguf(bf16, ours, ftype, imatrix=imatrix, **QUIET)
        cmd = [str(binary), *(["--imatrix", str(imatrix)] if imatrix else []), str(bf16), str(ref), ftype]
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
        assert r.returncode == 0, f"{ftype}: {r.stderr[-1500:]}"
        if ours.read_bytes() != ref.read_bytes():
            differ.append(f"{ftype} ({imatrix.name if imatrix else 'no imatrix'})")
    assert differ == [], f"{family}, llama.cpp {build}: not byte-identical: {differ}"


@pytest.mark.parametrize("build, var", BUILDS)
def test_include_and_exclude_weights_as_llama_quantize(build: str, var: str, inputs: dict, tmp_path: Path) -> None:
    binary = _quantize_bin(var, build)
    bf16, im_gguf, _ = inputs["qwen3-b16"]
    for flags, kwargs in ((["--exclude-weights", "ffn_down"], dict(exclude_weights=["ffn_down"])),
                          (["--include-weights", "attn_q", "--include-weights", "fc.weight"],
                           dict(include_weights=["attn_q", "fc.weight"]))):
        ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
        for f in (ours, ref):
            f.unlink(missing_ok=True)
        quantize_gguf(bf16, ours, "Q3_K_M", imatrix=im_gguf, **kwargs, **QUIET)
        r = subprocess.run([str(binary), "--imatrix", str(im_gguf), *flags, str(bf16), str(ref), "Q3_K_M"],
                           capture_output=True, text=True, errors="replace", timeout=300)
        assert r.returncode == 0, r.stderr[-1500:]
        assert ours.read_bytes() == ref.read_bytes(), flags
