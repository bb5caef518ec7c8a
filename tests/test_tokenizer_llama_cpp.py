"""Tokenizer metadata from an HF target dir, checked against llama.cpp's own converter.

The oracle is llama.cpp's ``convert_hf_to_gguf.py --vocab-only`` from a llama.cpp source tree (the
llama-cpp-python 0.3.36 sdist's vendor/llama.cpp), run through fixtures/llama_cpp_vocab.py with the
gguf-py vendored in that tree, as the converter itself arranges. Fixture tokenizers are tiny, so
their pre-tokenizer hash is not in llama.cpp's table: the script answers that one lookup with
``--pre qwen2`` (the fixtures' Split regex is Qwen2's); everything else is llama.cpp's code.

Set DFLASHKIT_LLAMA_CPP_SRC to that llama.cpp directory to run the oracle; without it the oracle
tests are skipped, and the committed expectation (written down from an oracle run) still runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import pytest
from gguf import GGUFValueType as V

import make_target  # on sys.path via conftest
from dflashkit.converters.tokenizer import tokenizer_from_hf_dir

# slow: llama.cpp's tokenizer against ours over many strings
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_TARGET = ROOT / "fixtures" / "example" / "target"
# tokenizer.* KVs llama.cpp's converter wrote for fixtures/example/target, as gguf-py's reader reads
# them back: [key, type, element type, value]. Written down from an oracle run
# (test_expected_file_is_llama_cpps re-derives it whenever the llama.cpp source is present).
EXPECTED = ROOT / "tests" / "data" / "example_target_tokenizer.llama_cpp.json"

LLAMA_CPP_SRC = os.environ.get("DFLASHKIT_LLAMA_CPP_SRC")
needs_llama_cpp = pytest.mark.skipif(
    not LLAMA_CPP_SRC or not (Path(LLAMA_CPP_SRC) / "convert_hf_to_gguf.py").is_file(),
    reason="set DFLASHKIT_LLAMA_CPP_SRC to a llama.cpp source tree (convert_hf_to_gguf.py) to run the oracle",
)


def run_oracle(hf_dir: Path, out: Path, build: str = "0.3.36") -> Path:
    from llama_cpp_oracle import require_llama_cpp_src

    src = require_llama_cpp_src(build)
    cmd = [sys.executable, str(ROOT / "fixtures" / "llama_cpp_vocab.py"), str(src), str(hf_dir), str(out), "--pre", "qwen2"]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # the converter's own gguf-py
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def ours(hf_dir: Path, out: Path) -> Path:
    """Our metadata for hf_dir, written to a GGUF the way the converter writes it into a drafter."""
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    writer = gguf.GGUFWriter(str(out), "qwen3")
    tokenizer_from_hf_dir(hf_dir, config["vocab_size"]).write_to(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return out


def kv_bytes(path: Path) -> list[tuple[str, bytes]]:
    """Every tokenizer.* KV of a GGUF as its exact serialized bytes (key, type, value), in order."""
    fields = gguf.GGUFReader(str(path)).fields.values()
    return [(f.name, b"".join(bytes(p) for p in f.parts)) for f in fields if f.name.startswith("tokenizer.")]


def kv_values(path: Path) -> list[list[Any]]:
    out = []
    for f in gguf.GGUFReader(str(path)).fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        vtype = V(f.types[0])
        sub = V(f.types[1]) if vtype is V.ARRAY else None
        value = f.contents()
        if sub is V.INT32:
            value = [int(x) for x in value]
        out.append([f.name, vtype.name, sub.name if sub else None, value])
    return out


def variant(tmp_path: Path) -> Path:
    """A Llama-3-like post-processor and the tokenizer_config corners llama.cpp's vendored gguf-py
    treats differently from the released gguf package: Sequence[ByteLevel, TemplateProcessing] whose
    leading token the config does not name as bos, add_bos_token in the config contradicting the
    post-processor, normalizer flags, and named chat templates."""
    hf = make_target.make_hf_target(tmp_path / "variant")
    tok_path = hf / "tokenizer.json"
    tok = json.loads(tok_path.read_text(encoding="utf-8"))
    tok["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [],
                "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [457], "tokens": ["<|im_start|>"]}},
            },
        ],
    }
    tok["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}
    tok_path.write_text(json.dumps(tok), encoding="utf-8")
    cfg_path = hf / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["add_bos_token"] = False  # the post-processor adds one: llama.cpp keeps the post-processor's
    cfg["add_eos_token"] = True  # the ByteLevel processor adds none: same
    cfg.pop("chat_template")
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    (hf / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    (hf / "additional_chat_templates").mkdir()
    (hf / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools }}", encoding="utf-8")
    return hf


def test_example_target_matches_committed_llama_cpp_output() -> None:
    # Non-skipping: the committed fixture's metadata, as llama.cpp's converter wrote it.
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    config = json.loads((EXAMPLE_TARGET / "config.json").read_text(encoding="utf-8"))
    meta = tokenizer_from_hf_dir(EXAMPLE_TARGET, config["vocab_size"])
    got = [[e.key, e.type.name, e.sub_type.name if e.sub_type else None, e.value] for e in meta.entries]
    assert got == expected
    # the add_eos_token that released gguf's SpecialVocab would leave out (ByteLevel post-processor)
    assert ["tokenizer.ggml.add_eos_token", "BOOL", None, False] in expected


@needs_llama_cpp
def test_expected_file_is_llama_cpps(tmp_path: Path) -> None:
    assert kv_values(run_oracle(EXAMPLE_TARGET, tmp_path / "oracle.gguf")) == json.loads(EXPECTED.read_text(encoding="utf-8"))


@needs_llama_cpp
def test_example_target_byte_identical_to_llama_cpp(oracle_build: str, tmp_path: Path) -> None:
    oracle = kv_bytes(run_oracle(EXAMPLE_TARGET, tmp_path / "oracle.gguf", build=oracle_build))
    assert kv_bytes(ours(EXAMPLE_TARGET, tmp_path / "ours.gguf")) == oracle


@needs_llama_cpp
def test_post_processor_corners_byte_identical_to_llama_cpp(oracle_build: str, tmp_path: Path) -> None:
    hf = variant(tmp_path)
    oracle = kv_bytes(run_oracle(hf, tmp_path / "oracle.gguf", build=oracle_build))
    got = kv_bytes(ours(hf, tmp_path / "ours.gguf"))
    assert [k for k, _ in got] == [k for k, _ in oracle]
    assert got == oracle
    keys = {k: v for k, _, _, v in kv_values(tmp_path / "oracle.gguf")}
    # what the case is about, as llama.cpp wrote it
    assert keys["tokenizer.ggml.add_bos_token"] is True and keys["tokenizer.ggml.add_eos_token"] is False
    assert keys["tokenizer.ggml.bos_token_id"] == 457  # <|im_start|>, the template's leading token
    assert keys["tokenizer.ggml.normalizer.lowercase"] is True
    assert keys["tokenizer.chat_templates"] == ["tool_use"]


def test_post_processor_corners_committed(tmp_path: Path) -> None:
    # Non-skipping twin of the test above: the keys and values llama.cpp's converter wrote for
    # variant() (oracle run with llama-cpp-python 0.3.36's llama.cpp), written down here.
    meta = tokenizer_from_hf_dir(variant(tmp_path), make_target.VOCAB_SIZE)
    assert [e.key for e in meta.entries][4:] == [
        "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.padding_token_id",  # cls (457 too) has no GGUF key: llama.cpp skips it
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.chat_template.tool_use",
        "tokenizer.chat_templates",
        "tokenizer.chat_template",
        "tokenizer.ggml.normalizer.lowercase",
    ]
    assert (meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")) == (457, 458)
    assert (meta.get("tokenizer.ggml.add_bos_token"), meta.get("tokenizer.ggml.add_eos_token")) == (True, False)
    assert meta.get("tokenizer.ggml.normalizer.lowercase") is True
    assert meta.get("tokenizer.chat_templates") == ["tool_use"]
    assert (meta.get("tokenizer.chat_template"), meta.get("tokenizer.chat_template.tool_use")) == ("{{ messages }}", "{{ tools }}")
