"""The three GGUF dialects: tables pinned to docs/dialects.md, translation round trips, refusals."""

from __future__ import annotations

import itertools
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

from conftest import FAMILIES, ROOT, target_for
from dflashkit.converters.convert import convert
from dflashkit.dialects import DFLASH_DRAFT, DIALECTS, LLAMA_CPP, LUCE, detect_dialect
from dflashkit.errors import DFlashError, UsageError
from dflashkit.quantize.gguf_file import quantize_gguf

import make_drafters

QUIET = dict(progress=False, warn=lambda m: None)

# ---- the tables, pinned to the facts of docs/dialects.md (written out by hand) -------------

FACT_KEYS = {
    "llama.cpp": {
        "{arch}.target_layers": (V.ARRAY, V.INT32),
        "{arch}.attention.layer_norm_rms_epsilon": (V.FLOAT32, None),
        "{arch}.block_count": (V.UINT32, None),
        "{arch}.context_length": (V.UINT32, None),
        "{arch}.embedding_length": (V.UINT32, None),
        "{arch}.feed_forward_length": (V.UINT32, None),
        "{arch}.attention.head_count": (V.UINT32, None),
        "{arch}.attention.head_count_kv": (V.UINT32, None),
        "{arch}.attention.key_length": (V.UINT32, None),
        "{arch}.attention.value_length": (V.UINT32, None),
        "{arch}.rope.freq_base": (V.FLOAT32, None),
        "{arch}.block_size": (V.UINT32, None),
        "tokenizer.ggml.mask_token_id": (V.UINT32, None),
        "{arch}.attention.sliding_window": (V.UINT32, None),
        "{arch}.attention.sliding_window_pattern": (V.ARRAY, V.BOOL),
        "{arch}.attention.causal": (V.BOOL, None),
        "{arch}.final_logit_softcapping": (V.FLOAT32, None),
        "{arch}.embedding_scale": (V.FLOAT32, None),
        "{arch}.logit_scale": (V.FLOAT32, None),
        "{arch}.attention.value_scale": (V.FLOAT32, None),
        "{arch}.rope.dimension_count": (V.UINT32, None),
        "{arch}.rope.dimension_sections": (V.ARRAY, V.INT32),
        "{arch}.conv_kernel_size": (V.UINT32, None),
        "{arch}.conv_group_size": (V.UINT32, None),
        "{arch}.selector_rank": (V.UINT32, None),
        "{arch}.selector_top_k": (V.UINT32, None),
        # DSpark (conversion/qwen.py DSparkModel, conversion/gemma.py Gemma4DSparkModel; gguf-py Keys.LLM
        # SAMPLE_FROM_ANCHOR / HAS_CONFIDENCE_HEAD / HIDDEN_ACT, Keys.Attention.SCALE)
        "{arch}.sample_from_anchor": (V.BOOL, None),
        "{arch}.has_confidence_head": (V.BOOL, None),
        "{arch}.attention.scale": (V.FLOAT32, None),
        # issue 13 (llama.cpp's conversion/base.py and src/models/dflash.cpp)
        "{arch}.rope.scaling.type": (V.STRING, None),
        "{arch}.rope.scaling.factor": (V.FLOAT32, None),
        "{arch}.rope.scaling.original_context_length": (V.UINT32, None),
        "{arch}.rope.scaling.yarn_ext_factor": (V.FLOAT32, None),
        "{arch}.rope.scaling.yarn_attn_factor": (V.FLOAT32, None),
        "{arch}.rope.scaling.yarn_beta_fast": (V.FLOAT32, None),
        "{arch}.rope.scaling.yarn_beta_slow": (V.FLOAT32, None),
        "{arch}.hidden_activation": (V.STRING, None),
    },
    "luce": {
        "{arch}.context_length": (V.UINT32, None),
        "{arch}.embedding_length": (V.UINT32, None),
        "{arch}.block_count": (V.UINT32, None),
        "{arch}.feed_forward_length": (V.UINT32, None),
        "{arch}.attention.head_count": (V.UINT32, None),
        "{arch}.attention.head_count_kv": (V.UINT32, None),
        "{arch}.attention.key_length": (V.UINT32, None),
        "{arch}.attention.value_length": (V.UINT32, None),
        "{arch}.vocab_size": (V.UINT32, None),
        "{arch}.attention.layer_norm_rms_epsilon": (V.FLOAT32, None),
        "{arch}.rope.freq_base": (V.FLOAT32, None),
        "{arch}.dflash.n_target_layers": (V.UINT32, None),
        "{arch}.dflash.block_size": (V.UINT32, None),
        "{arch}.dflash.mask_token_id": (V.UINT32, None),
        "{arch}.dflash.target_layer_ids": (V.ARRAY, V.INT32),  # the loader ignores any other element type
        "{arch}.attention.sliding_window": (V.UINT32, None),
        "{arch}.attention.sliding_window_pattern": (V.ARRAY, V.BOOL),  # likewise
        "{arch}.final_logit_softcapping": (V.FLOAT32, None),
    },
    "dflash-draft": {
        "{arch}.dflash.target_layer_ids": (V.ARRAY, V.INT32),
        "{arch}.dflash.block_size": (V.UINT32, None),
        "{arch}.dflash.mask_token_id": (V.UINT32, None),
        "{arch}.dflash.n_target_features": (V.UINT32, None),
        "{arch}.attention.causal": (V.BOOL, None),
        "{arch}.attention.sliding_window": (V.UINT32, None),
        "{arch}.attention.sliding_window_pattern": (V.ARRAY, V.BOOL),
        # "plus the usual hparams (embedding_length, block_count, attention.layer_norm_rms_epsilon, ...)"
        "{arch}.embedding_length": (V.UINT32, None),
        "{arch}.block_count": (V.UINT32, None),
        "{arch}.attention.layer_norm_rms_epsilon": (V.FLOAT32, None),
        "{arch}.context_length": (V.UINT32, None),
        "{arch}.feed_forward_length": (V.UINT32, None),
        "{arch}.attention.head_count": (V.UINT32, None),
        "{arch}.attention.head_count_kv": (V.UINT32, None),
        "{arch}.attention.key_length": (V.UINT32, None),
        "{arch}.attention.value_length": (V.UINT32, None),
        "{arch}.rope.freq_base": (V.FLOAT32, None),
    },
}

FACT_TENSORS = {
    "llama.cpp": {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
                  "layers.3.post_attention_layernorm.weight": "blk.3.ffn_norm.weight",
                  "layers.0.attention_conv.base_kernel": "blk.0.attn_conv_base",
                  "candidate_selector.predecessor_codebook.weight": "selector_predecessor.weight",
                  # DSpark heads and Gemma-4 DSpark norms (gguf-py MODEL_TENSOR names, llama.cpp's converter output)
                  "markov_head.markov_w1.weight": "markov_w1.weight", "confidence_head.proj.bias": "conf_proj.bias",
                  "d2t": "d2t", "layers.1.post_feedforward_layernorm.weight": "blk.1.post_ffw_norm.weight",
                  "layers.0.layer_scalar.weight": "blk.0.layer_output_scale.weight"},
    "luce": {"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
             "layers.3.post_attention_layernorm.weight": "blk.3.ffn_norm.weight"},
    "dflash-draft": {"fc.weight": "dflash_fc.weight", "hidden_norm.weight": "dflash_hidden_norm.weight",
                     "layers.3.post_attention_layernorm.weight": "blk.3.post_attention_norm.weight"},
}


def test_facts_file_is_in_the_repository() -> None:
    facts = (ROOT / "docs" / "dialects.md").read_text()
    for arch in ("dflash", "qwen35-dflash-draft", "gemma4-dflash-draft", "dflash-draft"):
        assert f"`{arch}`" in facts or f'"{arch}"' in facts
    # the hand-written tables above name only keys and tensors the facts file names
    for name, keys in FACT_KEYS.items():
        for key in keys:
            suffix = key.removeprefix("{arch}.")
            assert suffix in facts, (name, key)


@pytest.mark.parametrize("name", list(FACT_KEYS))
def test_table_keys_and_value_types_match_the_facts(name: str) -> None:
    dialect = DIALECTS[name]
    table = {ks.key: (ks.type, ks.sub_type) for ks in dialect.keys}
    for key, vtype in FACT_KEYS[name].items():
        assert table.get(key) == vtype, key
    # anything beyond the facts is an explicit, documented extension key
    for ks in dialect.keys:
        if ks.key not in FACT_KEYS[name]:
            assert ks.extension, ks.key


def test_architectures_and_tap_conventions() -> None:
    assert LLAMA_CPP.architectures == ("dflash",) and LLAMA_CPP.tap_offset == 1
    assert set(LUCE.architectures) == {"qwen35-dflash-draft", "gemma4-dflash-draft", "dflash-draft"}
    assert LUCE.tap_offset == 0 and DFLASH_DRAFT.tap_offset == 0
    assert detect_dialect("dflash") is LLAMA_CPP
    assert detect_dialect("qwen35-dflash-draft") is LUCE and detect_dialect("gemma4-dflash-draft") is LUCE
    assert detect_dialect("dflash-draft") is DFLASH_DRAFT
    assert detect_dialect("qwen3") is None
    assert LLAMA_CPP.taps_to_file([1, 16, 31, 46, 61]) == [2, 17, 32, 47, 62]
    assert LUCE.taps_to_file([1, 16, 31, 46, 61]) == [1, 16, 31, 46, 61]


@pytest.mark.parametrize("name", list(FACT_TENSORS))
def test_tensor_names_match_the_facts_both_ways(name: str) -> None:
    dialect = DIALECTS[name]
    for canonical, gguf_name in FACT_TENSORS[name].items():
        assert dialect.gguf_name(canonical) == gguf_name
        assert dialect.canonical_name(gguf_name) == canonical


def test_luce_aliases_are_read() -> None:
    assert LUCE.canonical_name("dflash_fc.weight") == "fc.weight"
    assert LUCE.canonical_name("dflash_hidden_norm.weight") == "hidden_norm.weight"
    assert LUCE.canonical_name("blk.2.post_attention_norm.weight") == "layers.2.post_attention_layernorm.weight"


# ---- written files: arch, value types, taps --------------------------------------------------


def fields(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    return {k: (f.types, f.contents()) for k, f in r.fields.items()}


def test_luce_file_types_and_raw_tap_ids(drafters, targets, tmp_path: Path) -> None:
    out = tmp_path / "luce.gguf"
    convert(drafters["qwen35-swa"], out, outtype="bf16", dialect="luce", target=targets[64]["gguf"], **QUIET)
    f = fields(out)
    arch = "qwen35-dflash-draft"
    assert f["general.architecture"][1] == arch
    assert f[f"{arch}.dflash.target_layer_ids"] == ([V.ARRAY, V.INT32], [1, 4, 9])  # raw HF ids
    assert f[f"{arch}.attention.sliding_window_pattern"] == ([V.ARRAY, V.BOOL], [True, True, False])
    assert f[f"{arch}.dflash.n_target_layers"] == ([V.UINT32], 3)  # Qwen script: number of taps
    assert f[f"{arch}.dflash.mask_token_id"] == ([V.UINT32], 500)
    names = {t.name for t in gguf.GGUFReader(out).tensors}
    assert {"dflash.fc.weight", "dflash.hidden_norm.weight", "blk.0.ffn_norm.weight"} <= names


def test_luce_gemma_stores_target_layer_count(drafters, targets, tmp_path: Path) -> None:
    out = tmp_path / "g.gguf"
    convert(drafters["gemma4"], out, outtype="bf16", dialect="luce", target=targets[72]["gguf"], **QUIET)
    f = fields(out)
    assert f["general.architecture"][1] == "gemma4-dflash-draft"
    assert f["gemma4-dflash-draft.dflash.n_target_layers"] == ([V.UINT32], 12)  # Gemma script: target layers
    assert f["gemma4-dflash-draft.final_logit_softcapping"] == ([V.FLOAT32], 30.0)


def test_dflash_draft_file(drafters, targets, tmp_path: Path) -> None:
    out = tmp_path / "dd.gguf"
    convert(drafters["qwen3-b16"], out, outtype="bf16", dialect="dflash-draft", target=targets[64]["gguf"], **QUIET)
    f = fields(out)
    assert f["general.architecture"][1] == "dflash-draft"
    assert f["dflash-draft.dflash.target_layer_ids"] == ([V.ARRAY, V.INT32], [1, 8])
    assert f["dflash-draft.dflash.n_target_features"] == ([V.UINT32], 128)  # 2 taps × hidden 64
    names = {t.name for t in gguf.GGUFReader(out).tensors}
    assert {"dflash_fc.weight", "dflash_hidden_norm.weight", "blk.1.post_attention_norm.weight"} <= names


# ---- round trips --------------------------------------------------------------------------------

ROUTES = list(itertools.permutations(["luce", "dflash-draft", "llama.cpp"], 2))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "dflash2"])
def test_round_trips_equal_direct_conversion(family: str, drafters, targets, tmp_path: Path) -> None:
    target = target_for(family, targets)
    direct = tmp_path / "direct.gguf"
    convert(drafters[family], direct, outtype="bf16", target=target, **QUIET)
    for a, b in ROUTES:
        first, second, back = (tmp_path / f"{a}-{b}-{i}.gguf" for i in range(3))
        convert(drafters[family], first, outtype="bf16", target=target, dialect=a, **QUIET)
        # gemma-4 in Luce needs the target's layer count: from --target, never guessed
        extra = {"target": target} if b == "luce" and family == "gemma4" else {}
        convert(first, second, dialect=b, **QUIET, **extra)
        convert(second, back, dialect="llama.cpp", **QUIET)
        assert back.read_bytes() == direct.read_bytes(), (a, b)


@pytest.mark.parametrize("quant", ["q8_0", "Q4_K_M"])
def test_round_trips_of_quantized_files(quant: str, drafters, targets, tmp_path: Path) -> None:
    src = drafters["qwen35-swa"]
    direct = tmp_path / "direct.gguf"
    if quant == "q8_0":
        convert(src, direct, outtype="q8_0", target=targets[64]["gguf"], **QUIET)
    else:
        convert(src, tmp_path / "f32.gguf", outtype="f32", target=targets[64]["gguf"], **QUIET)
        quantize_gguf(tmp_path / "f32.gguf", direct, quant, **QUIET)
    for a, b in ROUTES:
        first, second, back = (tmp_path / f"{a}-{b}-{i}.gguf" for i in range(3))
        convert(direct, first, dialect=a, **QUIET)
        convert(first, second, dialect=b, **QUIET)
        convert(second, back, dialect="llama.cpp", **QUIET)
        assert back.read_bytes() == direct.read_bytes(), (a, b)


def test_translation_copies_tensor_bytes_untouched(drafters, targets, tmp_path: Path) -> None:
    src = tmp_path / "q.gguf"
    convert(drafters["qwen3-b16"], src, outtype="q8_0", target=targets[64]["gguf"], **QUIET)
    out = tmp_path / "luce.gguf"
    convert(src, out, dialect="luce", **QUIET)
    a = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(src).tensors}
    b = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(out).tensors}
    assert b["dflash.fc.weight"] == a["fc.weight"]
    assert b["blk.1.ffn_down.weight"] == a["blk.1.ffn_down.weight"]


# ---- what a dialect lacks comes from a flag or --target, or the command stops ----------------


def _stop(src, out: Path, match: str, exc=DFlashError, **kw) -> None:
    with pytest.raises(exc) as info:
        convert(src, out, **QUIET, **kw)
    assert match in str(info.value), str(info.value)
    assert not out.exists()


def test_gemma_to_luce_needs_target_layer_count(drafters, targets, tmp_path: Path) -> None:
    src = tmp_path / "g.gguf"
    convert(drafters["gemma4"], src, outtype="bf16", target=targets[72]["gguf"], **QUIET)
    _stop(src, tmp_path / "o.gguf", "requires 'gemma4-dflash-draft.dflash.n_target_layers' but its value is unknown — pass --target (the target model) or --num-target-layers", dialect="luce")
    convert(src, tmp_path / "o.gguf", dialect="luce", num_target_layers=12, **QUIET)
    assert fields(tmp_path / "o.gguf")["gemma4-dflash-draft.dflash.n_target_layers"][1] == 12


def test_llama_cpp_needs_a_tokenizer(drafters, targets, tmp_path: Path) -> None:
    luce = tmp_path / "l.gguf"
    convert(drafters["qwen3-b16"], luce, outtype="bf16", dialect="luce", **QUIET)  # no --target: no tokenizer
    _stop(luce, tmp_path / "o.gguf", "has no tokenizer, which the llama.cpp dialect requires — pass --target", dialect="llama.cpp")
    convert(luce, tmp_path / "o.gguf", dialect="llama.cpp", target=targets[64]["gguf"], **QUIET)
    assert fields(tmp_path / "o.gguf")["tokenizer.ggml.model"][1] == "gpt2"


def test_missing_mask_id_needs_the_flag(drafters, targets, tmp_path: Path) -> None:
    import json
    import shutil

    d = tmp_path / "d"
    shutil.copytree(drafters["qwen3-b16"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"].pop("mask_token_id")
    (d / "config.json").write_text(json.dumps(cfg))
    _stop(d, tmp_path / "o.gguf", "requires 'tokenizer.ggml.mask_token_id' but its value is unknown — set dflash_config.mask_token_id in config.json or pass --mask-token-id")
    convert(d, tmp_path / "o.gguf", mask_token_id=500, **QUIET)
    assert fields(tmp_path / "o.gguf")["tokenizer.ggml.mask_token_id"][1] == 500


def test_flag_contradicting_the_source_is_an_error(drafters, tmp_path: Path) -> None:
    _stop(drafters["qwen3-b16"], tmp_path / "o.gguf", "--mask-token-id 7 contradicts the source's mask_token_id = 500", mask_token_id=7)


def test_dflash2_cannot_leave_llama_cpp(drafters, targets, tmp_path: Path) -> None:
    src = tmp_path / "d2.gguf"
    convert(drafters["dflash2"], src, outtype="bf16", target=targets[64]["gguf"], **QUIET)
    for d in ("luce", "dflash-draft"):
        _stop(src, tmp_path / "o.gguf", f"a DFlash 2 drafter cannot be written in the {d} dialect", dialect=d)


def test_unknown_tensor_in_source_gguf_is_refused(drafters, targets, tmp_path: Path) -> None:
    src = tmp_path / "s.gguf"
    convert(drafters["qwen3-b16"], src, outtype="f32", target=targets[64]["gguf"], **QUIET)
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(tmp_path / "extra.gguf", "dflash")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        sub = f.types[1] if len(f.types) > 1 else None
        w.add_key_value(k, f.contents(), f.types[0], sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data))
    w.add_tensor("blk.0.mystery.weight", np.zeros((2, 64), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    _stop(tmp_path / "extra.gguf", tmp_path / "o.gguf", "1 tensor(s) with no meaning in the llama.cpp dialect: blk.0.mystery.weight", dialect="luce")


def test_outtype_does_not_apply_to_translation(drafters, targets, tmp_path: Path) -> None:
    src = tmp_path / "s.gguf"
    convert(drafters["qwen3-b16"], src, outtype="f32", target=targets[64]["gguf"], **QUIET)
    _stop(src, tmp_path / "o.gguf", "copies its tensors untouched; --outtype does not apply", exc=UsageError, outtype="f16")


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (8, 2)])  # n_gqa 2 and 4: the mixes that depend on it
def test_k_quant_outtype_equals_convert_then_quantize(tmp_path: Path, heads: int, kv_heads: int) -> None:
    from dflashkit.filetypes import CONVERT_POLICY_OUTTYPES

    d = make_drafters.make_drafter(
        tmp_path / "d", "qwen3-b16",
        config_overrides=dict(hidden_size=256, intermediate_size=512, head_dim=32, num_hidden_layers=5,
                              num_attention_heads=heads, num_key_value_heads=kv_heads,
                              dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 3, 5, 7, 9]}),
    )
    convert(d, tmp_path / "f32.gguf", outtype="f32", **QUIET)
    for outtype in CONVERT_POLICY_OUTTYPES:
        quantize_gguf(tmp_path / "f32.gguf", tmp_path / "two.gguf", outtype.upper(), force=True, **QUIET)
        convert(d, tmp_path / "one.gguf", outtype=outtype, force=True, **QUIET)
        assert (tmp_path / "one.gguf").read_bytes() == (tmp_path / "two.gguf").read_bytes(), outtype
