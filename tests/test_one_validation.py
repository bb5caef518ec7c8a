"""One validation, every command (issue: hostile inputs): a drafter that breaks a rule is refused by each command
that would build or write something from it — convert, quantize, parity, accept — with the same one-line reason
naming the file, and reported by dflash-inspect as an error finding. Nothing is written.

HF cases edit the trained drafter's config.json; GGUF cases edit its converted bf16 GGUF (tests/hostile.py).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as V

from dflashkit.cli import accept_command, convert_command, inspect_command, parity_command, quantize_command
from dflashkit.converters.convert import convert

from hostile import rewrite_gguf

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HF_CASES = {
    "rope_theta": (lambda c: c["rope_parameters"].update(rope_theta=-10000.0),
                   "RoPE base frequency (rope_theta / rope.freq_base) must be a positive number, got -10000.0",
                   "drafter.values"),
    "yarn_factor_0": (lambda c: c.update(rope_parameters={"rope_theta": 1e6, "rope_type": "yarn", "factor": 0.0,
                                                          "original_max_position_embeddings": 4096}),
                      "RoPE scaling factor (yarn) must be a positive number, got 0.0", "drafter.values"),
    "yarn_factor_-4": (lambda c: c.update(rope_parameters={"rope_theta": 1e6, "rope_type": "yarn", "factor": -4.0,
                                                           "original_max_position_embeddings": 4096}),
                       "RoPE scaling factor (yarn) must be a positive number, got -4.0", "drafter.values"),
    "eps_0": (lambda c: c.update(rms_norm_eps=0.0), "RMS norm epsilon must be > 0, got 0.0", "drafter.values"),
    "eps_-1": (lambda c: c.update(rms_norm_eps=-1.0), "RMS norm epsilon must be > 0, got -1.0", "drafter.values"),
    "architectures_empty": (lambda c: c.update(architectures=[]), "'architectures' must be a non-empty list",
                            "drafter.config_invalid"),
}


@pytest.fixture(scope="module")
def hf_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, (edit, _, _) in HF_CASES.items():
        d = tmp_path_factory.mktemp(name) / "drafter"
        shutil.copytree(TRAINED / "drafter", d)
        config = json.loads((d / "config.json").read_text())
        edit(config)
        (d / "config.json").write_text(json.dumps(config))
        out[name] = d
    return out


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_config_refused_by_every_command(hf_cases: dict[str, Path], case: str, tmp_path: Path) -> None:
    src, (_, message, finding) = hf_cases[case], HF_CASES[case]
    out = tmp_path / "d.gguf"
    before = (src / "config.json").read_bytes()
    r = CliRunner().invoke(convert_command, [str(src), str(out), "-q"])
    assert r.exit_code == 1 and message in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not out.exists()
    r = CliRunner().invoke(inspect_command, [str(src), "--format", "json"])
    findings = {f["id"]: f["message"] for f in json.loads(r.stdout)["files"][0]["findings"] if f["severity"] == "error"}
    assert r.exit_code == 1 and finding in findings and message in findings[finding], findings
    r = CliRunner().invoke(parity_command, [str(TRAINED / "drafter"), str(src), "--skip-weights", "-q"])
    assert r.exit_code == 1 and message in r.output, r.output
    assert (src / "config.json").read_bytes() == before  # never modified


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "drafter-bf16.gguf"
    convert(TRAINED / "drafter", out, outtype="bf16", target=TRAINED / "target", warn=lambda m: None, progress=False)
    return out


def _i32(path: Path) -> dict[str, np.ndarray]:
    import gguf

    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.attn_q.weight")
    return {"blk.0.attn_q.weight": np.ones(tuple(int(d) for d in reversed(t.shape)), dtype=np.int32)}


GGUF_CASES = {
    "freq_base_-1": ({"set_keys": {"dflash.rope.freq_base": (-1.0, V.FLOAT32)}},
                     "RoPE base frequency (rope_theta / rope.freq_base) must be a positive number, got -1.0",
                     "drafter.values"),
    "eps_nan": ({"set_keys": {"dflash.attention.layer_norm_rms_epsilon": (math.nan, V.FLOAT32)}},
                "'dflash.attention.layer_norm_rms_epsilon' = nan is out of range (expected a finite number", "drafter.metadata_invalid"),
    "mask_is_vocab_size": ({"set_keys": {"tokenizer.ggml.mask_token_id": (768, V.UINT32)}},
                           "mask token id 768 is outside the vocabulary (768 tokens)", "drafter.mask_token"),
    "empty_token_list": ({"set_keys": {"tokenizer.ggml.tokens": ([], V.ARRAY, V.STRING)}},
                         "tokenizer.ggml.tokens is an empty list", "drafter.metadata_invalid"),
    "i32_weight": ({"replace": _i32}, "tensor 'blk.0.attn_q.weight' has dtype I32; drafter weights must be float (BF16, F16, F32) or "
                   "a ggml quantized type",
                   "drafter.dtype"),
}


@pytest.fixture(scope="module")
def gguf_cases(base_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf_cases")
    out = {}
    for name, (edit, _, _) in GGUF_CASES.items():
        kwargs = {k: (v(base_gguf) if callable(v) else v) for k, v in edit.items()}
        out[name] = rewrite_gguf(base_gguf, root / f"{name}.gguf", **kwargs)
    return out


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_refused_by_every_command(gguf_cases: dict[str, Path], case: str, tmp_path: Path) -> None:
    src, (_, message, finding) = gguf_cases[case], GGUF_CASES[case]
    before = src.read_bytes()
    out = tmp_path / "q.gguf"
    r = CliRunner().invoke(quantize_command, [str(src), str(out), "Q8_0", "-q"])
    assert r.exit_code == 1 and message in r.output and str(src) in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not out.exists()
    r = CliRunner().invoke(inspect_command, [str(src), "--format", "json"])
    findings = {f["id"]: f["message"] for f in json.loads(r.stdout)["files"][0]["findings"] if f["severity"] == "error"}
    assert r.exit_code == 1 and finding in findings and message in findings[finding], findings
    r = CliRunner().invoke(parity_command, [str(TRAINED / "drafter"), str(src), "--skip-weights", "-q"])
    assert r.exit_code == 1 and message in r.output, r.output
    r = CliRunner().invoke(convert_command, [str(src), str(out), "-q"])  # a GGUF source: translation
    assert r.exit_code == 1 and message in r.output and not out.exists(), r.output
    assert src.read_bytes() == before


def test_accept_refuses_the_same_file(gguf_cases: dict[str, Path]) -> None:
    src = gguf_cases["i32_weight"]
    r = CliRunner().invoke(accept_command, [str(src), "--target", str(TRAINED / "target"), "--prompts",
                                            str(TRAINED / "prompts.jsonl"), "--max-prompts", "1",
                                            "--max-new-tokens", "4", "-q"])
    assert r.exit_code == 1 and GGUF_CASES["i32_weight"][1] in r.output, r.output
