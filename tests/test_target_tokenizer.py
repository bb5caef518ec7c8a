"""--target: tokenizer metadata from a target HF dir / GGUF, load_target, and every error message."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

import make_target  # on sys.path via conftest
from dflashkit.converters import tokenizer as tk
from dflashkit.converters.target import load_target
from dflashkit.converters.tokenizer import tokenizer_from_gguf, tokenizer_from_hf_dir
from dflashkit.errors import DFlashError
from dflashkit.io.gguf_reader import GGUFFile, open_gguf

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
N_BASE = 256 + make_target.N_MERGES  # byte alphabet + merges; added tokens follow
ENDOFTEXT, IM_START, IM_END, THINK, END_THINK = range(N_BASE, N_BASE + 5)
MASK = make_target.MASK_TOKEN_ID


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_target.make_hf_target(tmp_path_factory.mktemp("t") / "Tiny-Qwen3")


@pytest.fixture(scope="module")
def target_gguf(hf: Path) -> Path:
    return make_target.make_gguf_target(hf.parent / "tiny.gguf", hf)


@pytest.fixture
def hf_copy(hf: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(hf, tmp_path / "copy"))


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data), encoding="utf-8")


def error(fn: Any, *args: Any) -> str:
    with pytest.raises(DFlashError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def reader_fields(path: Path) -> list[tuple[str, V, V | None, Any]]:
    """(key, type, sub_type, value) of every KV, as gguf-py's own reader sees them."""
    out = []
    for field in gguf.GGUFReader(str(path)).fields.values():
        if field.name.startswith("GGUF."):
            continue
        vtype = V(field.types[0])
        sub = V(field.types[1]) if vtype is V.ARRAY else None
        value = field.contents()
        if sub is V.INT32:
            value = [int(x) for x in value]
        out.append((field.name, vtype, sub, value))
    return out


# --------------------------------------------------------------------------------------------
# From an HF directory: the exact keys llama.cpp's converter writes


def test_hf_tokenizer_keys_order_and_types(hf: Path) -> None:
    meta = tokenizer_from_hf_dir(hf, make_target.VOCAB_SIZE)
    assert [(e.key, e.type, e.sub_type) for e in meta.entries] == [
        ("tokenizer.ggml.model", V.STRING, None),
        ("tokenizer.ggml.pre", V.STRING, None),
        ("tokenizer.ggml.tokens", V.ARRAY, V.STRING),
        ("tokenizer.ggml.token_type", V.ARRAY, V.INT32),
        ("tokenizer.ggml.merges", V.ARRAY, V.STRING),
        ("tokenizer.ggml.eos_token_id", V.UINT32, None),  # tokenizer_config's eos_token
        ("tokenizer.ggml.padding_token_id", V.UINT32, None),  # tokenizer_config's pad_token
        ("tokenizer.ggml.bos_token_id", V.UINT32, None),  # config.json's bos_token_id
        ("tokenizer.ggml.add_bos_token", V.BOOL, None),  # ByteLevel post-processor: False
        ("tokenizer.ggml.add_eos_token", V.BOOL, None),
        ("tokenizer.chat_template", V.STRING, None),
    ]
    assert meta.get("tokenizer.ggml.model") == "gpt2"
    assert meta.get("tokenizer.ggml.pre") == "qwen2"
    assert meta.get("tokenizer.ggml.eos_token_id") == IM_END
    assert meta.get("tokenizer.ggml.padding_token_id") == ENDOFTEXT
    assert meta.get("tokenizer.ggml.bos_token_id") == ENDOFTEXT
    assert meta.get("tokenizer.ggml.add_bos_token") is False
    assert meta.get("tokenizer.ggml.add_eos_token") is False
    assert meta.get("tokenizer.chat_template") == make_target.CHAT_TEMPLATE
    assert meta.source == f"target HF dir {hf}"


def test_hf_token_list_pad_fill_and_types(hf: Path) -> None:
    meta = tokenizer_from_hf_dir(hf, make_target.VOCAB_SIZE)
    tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type")
    assert meta.vocab_size == len(tokens) == len(types) == make_target.VOCAB_SIZE
    assert tokens[:256] == list(make_target.bytes_to_unicode().values())
    assert tokens[ENDOFTEXT:END_THINK + 1] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    assert types[:N_BASE] == [NORMAL] * N_BASE
    assert types[ENDOFTEXT:END_THINK + 1] == [CONTROL, CONTROL, CONTROL, USER_DEFINED, USER_DEFINED]
    assert tokens[MASK] == make_target.MASK_TOKEN and types[MASK] == CONTROL
    pads = [i for i in range(make_target.VOCAB_SIZE) if i > END_THINK and i != MASK]
    assert [tokens[i] for i in pads] == [f"[PAD{i}]" for i in pads]
    assert {types[i] for i in pads} == {UNUSED}


def test_hf_merges_are_the_tokenizer_json_pairs(hf: Path) -> None:
    meta = tokenizer_from_hf_dir(hf, make_target.VOCAB_SIZE)
    pairs = json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"]
    assert meta.get("tokenizer.ggml.merges") == [f"{a} {b}" for a, b in pairs]
    assert len(pairs) == make_target.N_MERGES and pairs[0] == ["Ġ", "t"]


def test_hf_vocab_size_beyond_the_tokenizer_pads_further(hf: Path) -> None:
    meta = tokenizer_from_hf_dir(hf, 600)
    assert meta.vocab_size == 600
    assert meta.get("tokenizer.ggml.tokens")[599] == "[PAD599]"
    assert meta.get("tokenizer.ggml.token_type")[599] == UNUSED


def test_hf_base_model_has_no_chat_template(tmp_path: Path) -> None:
    base = make_target.make_hf_target(tmp_path / "base", instruct=False)
    meta = tokenizer_from_hf_dir(base, make_target.VOCAB_SIZE)
    assert meta.get("tokenizer.chat_template") is None
    assert meta.get("tokenizer.ggml.eos_token_id") == ENDOFTEXT


def test_hf_chat_template_jinja_file_and_named_templates(hf_copy: Path) -> None:
    edit_json(hf_copy / "tokenizer_config.json", chat_template=None)
    (hf_copy / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    assert tokenizer_from_hf_dir(hf_copy, 512).get("tokenizer.chat_template") == "{{ messages }}"
    edit_json(hf_copy / "tokenizer_config.json", chat_template=[
        {"name": "default", "template": "D"}, {"name": "tool use", "template": "T"},
    ])
    entries = [(e.key, e.value) for e in tokenizer_from_hf_dir(hf_copy, 512).entries if "chat_template" in e.key]
    assert entries == [
        ("tokenizer.chat_template.tool_use", "T"),
        ("tokenizer.chat_templates", ["tool_use"]),
        ("tokenizer.chat_template", "D"),
    ]


def test_hf_template_post_processor_sets_add_bos(hf_copy: Path) -> None:
    # Llama-3 style: TemplateProcessing puts the BOS first, so add_bos_token is true.
    tok = hf_copy / "tokenizer.json"
    data = json.loads(tok.read_text(encoding="utf-8"))
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [IM_START], "tokens": ["<|im_start|>"]}},
    }
    tok.write_text(json.dumps(data), encoding="utf-8")
    edit_json(hf_copy / "tokenizer_config.json", bos_token="<|im_start|>")
    meta = tokenizer_from_hf_dir(hf_copy, 512)
    assert meta.get("tokenizer.ggml.add_bos_token") is True
    assert meta.get("tokenizer.ggml.bos_token_id") == IM_START


def test_pre_tokenizer_hash_is_llama_cpps() -> None:
    # The check text is llama.cpp's chktxt byte for byte, and its table resolves duplicates as its
    # chain of ifs does (the last match wins).
    assert hashlib.sha256(tk._CHKTXT.encode()).hexdigest() == "a36179c1e2b1cfcfbfad1dc779addad2ffc778201e4cf0d538bddeafa2c526da"
    table = tk.LLAMA_CPP_PRE_HASHES
    assert table["e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea"] == "qwen2"  # Qwen1.5/2/3
    assert table["d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c"] == "qwen2"
    assert table["0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5"] == "llama-bpe"
    assert table["b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166"] == "olmo"
    assert len(table) == 95


def test_unknown_hash_identified_by_the_split_regex(hf: Path) -> None:
    # A ~500-token vocabulary cannot reproduce Qwen's ids for the check text, so its hash is not in
    # llama.cpp's table; its Split regex is Qwen2's exactly, which identifies the pre-tokenizer.
    chkhsh = tk.pre_tokenizer_hash(tk.load_backend(hf / "tokenizer.json"))
    assert chkhsh not in tk.LLAMA_CPP_PRE_HASHES
    assert tokenizer_from_hf_dir(hf, 512).get("tokenizer.ggml.pre") == "qwen2"


def test_tokens_and_merges_hashes(hf: Path, tmp_path: Path) -> None:
    meta = tokenizer_from_hf_dir(hf, 512)
    assert meta.tokens_hash() == tokenizer_from_hf_dir(hf, 512).tokens_hash()
    assert meta.tokens_hash() != tokenizer_from_hf_dir(hf, 513).tokens_hash()
    assert len(meta.merges_hash()) == 64 and meta.merges_hash() != meta.tokens_hash()


# --------------------------------------------------------------------------------------------
# HF errors


def test_error_unknown_pre_tokenizer_hash(hf_copy: Path) -> None:
    tok = hf_copy / "tokenizer.json"
    data = json.loads(tok.read_text(encoding="utf-8"))
    data["model"]["merges"] = data["model"]["merges"][1:]  # other merges: other ids for the check text
    # and a Split regex of no known pre-tokenizer
    data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\p{N}+|\s+"
    tok.write_text(json.dumps(data), encoding="utf-8")
    message = error(tokenizer_from_hf_dir, hf_copy, 512)
    chkhsh = tk.pre_tokenizer_hash(tk.load_backend(tok))
    assert message == (
        f"{tok}: pre-tokenizer hash {chkhsh} is not recognised (not in llama.cpp's convert_hf_to_gguf "
        f"table); pass the target's GGUF file as --target instead"
    )


def test_error_sentencepiece_only(hf_copy: Path) -> None:
    (hf_copy / "tokenizer.json").unlink()
    (hf_copy / "tokenizer.model").write_bytes(b"\x0a\x05dummy")
    expected = (
        f"{hf_copy}: sentencepiece tokenizer (tokenizer.model) cannot be converted from an HF directory; "
        f"pass the target's GGUF file as --target instead"
    )
    assert error(tokenizer_from_hf_dir, hf_copy, 512) == expected
    assert error(load_target, hf_copy) == expected


def test_error_byte_fallback_bpe(hf_copy: Path) -> None:
    tok = hf_copy / "tokenizer.json"
    data = json.loads(tok.read_text(encoding="utf-8"))
    data["model"]["byte_fallback"] = True
    tok.write_text(json.dumps(data), encoding="utf-8")
    assert error(tokenizer_from_hf_dir, hf_copy, 512) == (
        f"{tok}: byte-fallback BPE is not a byte-level BPE (gpt2-style) tokenizer, the only kind rebuilt "
        f"from an HF directory; pass the target's GGUF file as --target instead"
    )


def test_error_no_tokenizer_files(hf_copy: Path) -> None:
    (hf_copy / "tokenizer.json").unlink()
    assert error(load_target, hf_copy) == (
        f"{hf_copy}: no tokenizer files (tokenizer.json); pass the target's GGUF file "
        f"or a complete HF directory as --target"
    )


def test_error_token_id_beyond_vocab_size(hf: Path) -> None:
    assert error(tokenizer_from_hf_dir, hf, 400) == (
        f"{hf / 'tokenizer.json'}: token '{make_target.MASK_TOKEN}' has id {MASK}, but the config's "
        f"vocab_size is 400; the tokenizer does not belong to this model"
    )


def test_error_bad_json(hf_copy: Path) -> None:
    (hf_copy / "tokenizer_config.json").write_text("{nope", encoding="utf-8")
    message = error(tokenizer_from_hf_dir, hf_copy, 512)
    assert message.startswith(f"{hf_copy / 'tokenizer_config.json'}: cannot read JSON (")
    assert message.endswith("); re-download the file")


def test_error_without_tokenizers_package(hf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails
    assert error(tokenizer_from_hf_dir, hf, 512) == (
        f"{hf / 'tokenizer.json'}: identifying the pre-tokenizer needs the 'tokenizers' package; "
        f"pip install tokenizers, or pass the target's GGUF file as --target"
    )


# --------------------------------------------------------------------------------------------
# From a GGUF: verbatim copy


def test_gguf_copy_is_verbatim(target_gguf: Path, hf: Path) -> None:
    with open_gguf(target_gguf) as g:
        meta = tokenizer_from_gguf(g)
    assert meta is not None
    expected = [f for f in reader_fields(target_gguf) if f[0].startswith("tokenizer.")]
    assert [(e.key, e.type, e.sub_type, e.value) for e in meta.entries] == expected
    assert meta.source == "target GGUF tiny.gguf"
    assert meta.vocab_size == make_target.VOCAB_SIZE
    # same metadata as built from the HF dir (make_gguf_target wrote exactly those entries)
    from_hf = tokenizer_from_hf_dir(hf, make_target.VOCAB_SIZE)
    assert meta.entries == from_hf.entries
    assert (meta.tokens_hash(), meta.merges_hash()) == (from_hf.tokens_hash(), from_hf.merges_hash())


def test_write_to_round_trips_types(target_gguf: Path, tmp_path: Path) -> None:
    with open_gguf(target_gguf) as g:
        meta = tokenizer_from_gguf(g)
    out = tmp_path / "copy.gguf"
    writer = gguf.GGUFWriter(str(out), "dflash")
    meta.write_to(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert [f for f in reader_fields(out) if f[0].startswith("tokenizer.")] == [
        f for f in reader_fields(target_gguf) if f[0].startswith("tokenizer.")
    ]


def write_gguf(path: Path, kvs: dict[str, tuple[Any, V, V | None]], tensors: dict[str, np.ndarray] | None = None) -> Path:
    writer = gguf.GGUFWriter(str(path), "qwen3")
    for key, (value, vtype, sub) in kvs.items():
        writer.add_key_value(key, value, vtype, sub)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


SHAPE_KVS = {"qwen3.embedding_length": (32, V.UINT32, None), "qwen3.block_count": (8, V.UINT32, None)}


def test_gguf_without_tokenizer_gives_none(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "bare.gguf", SHAPE_KVS)
    with open_gguf(path) as g:
        assert tokenizer_from_gguf(g) is None


def test_gguf_tokenizer_without_model_key_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "half.gguf", {**SHAPE_KVS, "tokenizer.chat_template": ("x", V.STRING, None)})
    with open_gguf(path) as g:
        assert error(tokenizer_from_gguf, g) == (
            f"{path}: has tokenizer.* keys but no tokenizer.ggml.model; llama.cpp cannot load a tokenizer "
            "from it; pass the target's HF directory as --target instead"
        )


# --------------------------------------------------------------------------------------------
# load_target


def test_load_target_hf(hf: Path) -> None:
    t = load_target(hf)
    assert (t.kind, t.architecture, t.name) == ("hf", "Qwen3ForCausalLM", "Tiny-Qwen3")
    assert (t.hidden_size, t.n_layers, t.vocab_size) == (make_target.HIDDEN_SIZE, make_target.N_LAYERS, make_target.VOCAB_SIZE)
    assert t.path == str(hf)
    assert t.metadata == json.loads((hf / "config.json").read_text(encoding="utf-8"))
    assert t.tokenizer is not None and t.tokenizer.get("tokenizer.ggml.pre") == "qwen2"
    assert load_target(hf / "config.json") == t  # the config file stands for its directory


def test_load_target_gguf(target_gguf: Path, hf: Path) -> None:
    t = load_target(str(target_gguf))
    assert (t.kind, t.architecture, t.name) == ("gguf", "qwen3", "Tiny-Qwen3")
    assert (t.hidden_size, t.n_layers, t.vocab_size) == (make_target.HIDDEN_SIZE, make_target.N_LAYERS, make_target.VOCAB_SIZE)
    assert t.metadata["general.architecture"] == "qwen3"
    assert t.metadata["tokenizer.chat_template"] == make_target.CHAT_TEMPLATE
    assert t.tokenizer is not None and t.tokenizer.tokens_hash() == load_target(hf).tokenizer.tokens_hash()


def test_load_target_never_reads_weights(hf_copy: Path, target_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (hf_copy / "model.safetensors").write_bytes(b"not a checkpoint")  # would fail if read
    assert load_target(hf_copy).hidden_size == make_target.HIDDEN_SIZE

    def refuse(*_: Any) -> None:
        raise AssertionError("tensor data read")

    monkeypatch.setattr(GGUFFile, "raw", refuse)
    monkeypatch.setattr(GGUFFile, "array", refuse)
    assert load_target(target_gguf).vocab_size == make_target.VOCAB_SIZE


def test_load_target_gguf_vocab_size_sources(tmp_path: Path) -> None:
    embd = np.zeros((77, 32), dtype=np.float32)
    tokens = {"tokenizer.ggml.model": ("gpt2", V.STRING, None), "tokenizer.ggml.tokens": (["a", "b", "c"], V.ARRAY, V.STRING)}
    with_key = write_gguf(tmp_path / "a.gguf", {**SHAPE_KVS, "qwen3.vocab_size": (99, V.UINT32, None), **tokens}, {"token_embd.weight": embd})
    assert load_target(with_key).vocab_size == 99
    from_tokens = write_gguf(tmp_path / "b.gguf", {**SHAPE_KVS, **tokens}, {"token_embd.weight": embd})
    assert load_target(from_tokens).vocab_size == 3
    from_embd = write_gguf(tmp_path / "c.gguf", SHAPE_KVS, {"token_embd.weight": embd})
    t = load_target(from_embd)
    assert (t.vocab_size, t.tokenizer, t.name) == (77, None, "c")
    nothing = write_gguf(tmp_path / "d.gguf", SHAPE_KVS)
    assert error(load_target, nothing) == (
        f"{nothing}: no 'qwen3.vocab_size', tokenizer.ggml.tokens or token_embd.weight to tell the vocab size; "
        f"re-convert the target with llama.cpp"
    )


def test_load_target_hf_text_config_first(hf_copy: Path) -> None:
    config = json.loads((hf_copy / "config.json").read_text(encoding="utf-8"))
    top = {"architectures": ["Gemma4ForConditionalGeneration"], "hidden_size": 7, "vocab_size": 3}
    top["text_config"] = {k: config[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
    (hf_copy / "config.json").write_text(json.dumps(top), encoding="utf-8")
    t = load_target(hf_copy)
    assert (t.architecture, t.hidden_size, t.n_layers, t.vocab_size) == (
        "Gemma4ForConditionalGeneration", make_target.HIDDEN_SIZE, make_target.N_LAYERS, make_target.VOCAB_SIZE,
    )


# --------------------------------------------------------------------------------------------
# load_target errors

FIX = "pass the target's .gguf file or its HF model directory (the one with config.json)"


def test_error_nonexistent_path(tmp_path: Path) -> None:
    assert error(load_target, tmp_path / "nope") == f"target {tmp_path / 'nope'}: no such file or directory; {FIX}"


def test_error_dir_without_config(tmp_path: Path) -> None:
    assert error(load_target, tmp_path) == f"target {tmp_path}: directory has no config.json; {FIX}"


def test_error_not_a_gguf(hf: Path) -> None:
    path = hf / "tokenizer.json"
    assert error(load_target, path) == f"target {path}: not a GGUF file (no GGUF magic); {FIX}"


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size"])
def test_error_missing_config_key(hf_copy: Path, key: str) -> None:
    edit_json(hf_copy / "config.json", **{key: None})
    assert error(load_target, hf_copy) == (
        f"{hf_copy / 'config.json'}: missing {key!r} (looked in the top level); the target config must define it"
    )


@pytest.mark.parametrize("bad", [0, -4, "32", 32.0, True])
def test_error_invalid_config_value(hf_copy: Path, bad: Any) -> None:
    edit_json(hf_copy / "config.json", hidden_size=bad)
    assert error(load_target, hf_copy) == (
        f"{hf_copy / 'config.json'}: 'hidden_size' is {bad!r}, expected a positive integer; fix or re-download the file"
    )


def test_error_missing_text_config_key(hf_copy: Path) -> None:
    edit_json(hf_copy / "config.json", text_config={"hidden_size": 32}, num_hidden_layers=None)
    assert error(load_target, hf_copy) == (
        f"{hf_copy / 'config.json'}: missing 'num_hidden_layers' (looked in text_config or the top level); "
        f"the target config must define it"
    )


@pytest.mark.parametrize("key", ["qwen3.embedding_length", "qwen3.block_count"])
def test_error_gguf_missing_key(tmp_path: Path, key: str) -> None:
    path = write_gguf(tmp_path / "x.gguf", {k: v for k, v in SHAPE_KVS.items() if k != key})
    assert error(load_target, path) == f"{path}: missing {key!r}; re-convert the target with llama.cpp"


def test_error_gguf_truncated_is_the_readers(target_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(target_gguf.read_bytes()[:200])
    assert str(cut) in error(load_target, cut)


# --------------------------------------------------------------------------------------------
# The fixture itself


def test_fixture_is_deterministic_and_small(hf: Path, target_gguf: Path, tmp_path: Path) -> None:
    again = make_target.make_hf_target(tmp_path / "Tiny-Qwen3")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (hf / name).read_bytes(), name
        assert (hf / name).stat().st_size < 1_000_000
    gguf_again = make_target.make_gguf_target(tmp_path / "tiny.gguf", again)
    assert gguf_again.read_bytes() == target_gguf.read_bytes()
    assert target_gguf.stat().st_size < 1_000_000
    with open_gguf(target_gguf) as g:
        assert g.tensors["token_embd.weight"].shape == (make_target.VOCAB_SIZE, make_target.HIDDEN_SIZE)
        assert g.tensors["blk.0.attn_q.weight"].shape == (make_target.N_HEADS * make_target.HEAD_DIM, make_target.HIDDEN_SIZE)
        assert len(g.tensors) == 3 + 11 * make_target.N_LAYERS
        assert "qwen3.vocab_size" not in g.kvs
