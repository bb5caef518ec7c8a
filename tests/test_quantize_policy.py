"""The per-tensor type policy against llama.cpp's llama-quantize rules (src/llama-quant.cpp).

Expected types are written out by hand from llama.cpp's rules (comments give the derivation), never
computed with the code under test. Drafters come from the project's fixture generator + converter.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

import make_drafters  # on sys.path via conftest
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError, UsageError
from dflashkit.io.gguf_reader import open_gguf
from dflashkit.quantize.policy import (
    FILE_TYPES,
    choose_types,
    get_file_type,
    parse_tensor_type_override,
    use_more_bits,
)

# Row lengths that are multiples of 256: no K-quant fallback anywhere.
WIDE = dict(hidden_size=256, intermediate_size=512, head_dim=64, num_attention_heads=4, num_key_value_heads=2)


def _gguf_tensors(tmp: Path, family: str, **overrides) -> list[tuple[str, tuple[int, ...], Q]]:
    src = make_drafters.make_drafter(tmp / family, family, config_overrides=overrides)
    out = tmp / f"{family}.gguf"
    convert(src, out, progress=False, warn=lambda m: None)  # bf16 checkpoint -> BF16 matrices, F32 norms
    with open_gguf(out) as gf:
        return [(t.name, t.shape, t.ggml_type) for t in gf.tensors.values()]


@pytest.fixture(scope="module")
def five_layers(tmp_path_factory) -> list[tuple[str, tuple[int, ...], Q]]:
    """qwen3-b16 drafter, 5 layers, 5 taps (fc: 1280 -> 256)."""
    return _gguf_tensors(
        tmp_path_factory.mktemp("five"), "qwen3-b16", **WIDE, num_hidden_layers=5,
        dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 3, 5, 7, 9]},
    )


@pytest.fixture(scope="module")
def two_layers(tmp_path_factory) -> list[tuple[str, tuple[int, ...], Q]]:
    """DFlash 2 drafter, 2 layers, 2 taps: conv bases (3-D, no .weight), conv projections, selectors."""
    return _gguf_tensors(
        tmp_path_factory.mktemp("two"), "dflash2", **WIDE, num_hidden_layers=2,
        dflash_config={"mask_token_id": 500, "target_layer_ids": [2, 7], "conv_kernel_size": 3,
                       "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 4},
    )


# ---------------------------------------------------------------------------------------------------------
# Expected tables. Default type per file type (llama_ftype_get_default_type):
#   Q8_0 -> Q8_0, Q6_K -> Q6_K, Q5_K_M/Q5_K_S -> Q5_K, Q4_K_M/Q4_K_S -> Q4_K, F16 -> F16, BF16 -> BF16.
# Everything quantizable (>= 2-D, name ends in "weight", not "_norm.weight") gets the default, except
# attn_v and ffn_down (llama_tensor_get_type_impl):
#   Q4_K_M / Q5_K_M: Q6_K where use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2
#                    (i = attn_v counter among n_attention_wv = n_layers attn_v tensors; for ffn_down
#                    i = layer, n = block_count)
#   Q4_K_S:          attn_v Q5_K while the attn_v counter < 4; ffn_down Q5_K for layers < n/8
# 1-D tensors (norms) and the conv bases (3-D, no ".weight") keep F32. fc, conv_proj, selector_*, attn_q/k/
# output, ffn_gate/up have no rule (category OTHER or no rule for these file types): default type.
#
# 5 layers: n/8 = 0, 7n/8 = 4  -> use_more_bits at i = 2 ((2-0)%3 == 2) and i = 4 (>= 4).
#   Q4_K_S attn_v: counter 0..3 < 4 -> layers 0-3 Q5_K, layer 4 Q4_K; ffn_down: i < 0 never.
# 2 layers: n/8 = 0, 7n/8 = 1  -> use_more_bits only at i = 1.
#   Q4_K_S attn_v: counters 0, 1 < 4 -> both Q5_K; ffn_down never.
K4, K5, K6 = Q.Q4_K, Q.Q5_K, Q.Q6_K
DEFAULT = {"Q8_0": Q.Q8_0, "Q6_K": K6, "Q5_K_M": K5, "Q5_K_S": K5, "Q4_K_M": K4, "Q4_K_S": K4,
           "F16": Q.F16, "BF16": Q.BF16}
#              file type: (attn_v per layer,          ffn_down per layer)
FIVE_LAYER_MIX = {
    "Q8_0":   ([Q.Q8_0] * 5,              [Q.Q8_0] * 5),
    "Q6_K":   ([K6] * 5,                  [K6] * 5),
    "Q5_K_M": ([K5, K5, K6, K5, K6],      [K5, K5, K6, K5, K6]),
    "Q5_K_S": ([K5] * 5,                  [K5] * 5),
    "Q4_K_M": ([K4, K4, K6, K4, K6],      [K4, K4, K6, K4, K6]),
    "Q4_K_S": ([K5, K5, K5, K5, K4],      [K4] * 5),
    "F16":    ([Q.F16] * 5,               [Q.F16] * 5),
    "BF16":   ([Q.BF16] * 5,              [Q.BF16] * 5),
}
TWO_LAYER_MIX = {
    "Q8_0":   ([Q.Q8_0] * 2, [Q.Q8_0] * 2),
    "Q6_K":   ([K6, K6],     [K6, K6]),
    "Q5_K_M": ([K5, K6],     [K5, K6]),
    "Q5_K_S": ([K5, K5],     [K5, K5]),
    "Q4_K_M": ([K4, K6],     [K4, K6]),
    "Q4_K_S": ([K5, K5],     [K4, K4]),
    "F16":    ([Q.F16] * 2,  [Q.F16] * 2),
    "BF16":   ([Q.BF16] * 2, [Q.BF16] * 2),
}


def _expected(names: list[str], ftype: str, mix: tuple[list[Q], list[Q]]) -> dict[str, Q]:
    attn_v, ffn_down = mix
    out = {}
    for name in names:
        m = re.match(r"blk\.(\d+)\.(\w+?)(\.weight)?$", name)
        role = m.group(2) if m else name.removesuffix(".weight")
        if role.endswith("norm") or role.endswith("conv_base"):
            out[name] = Q.F32
        elif role == "attn_v":
            out[name] = attn_v[int(m.group(1))]
        elif role == "ffn_down":
            out[name] = ffn_down[int(m.group(1))]
        else:
            out[name] = DEFAULT[ftype]
    return out


def test_five_layer_tensor_set(five_layers):
    names = [n for n, _, _ in five_layers]
    assert len(names) == 3 + 5 * 11
    assert dict((n, s) for n, s, _ in five_layers)["fc.weight"] == (256, 1280)


@pytest.mark.parametrize("ftype", list(FIVE_LAYER_MIX))
def test_policy_five_layers(five_layers, ftype):
    got = {c.name: c.new_type for c in choose_types(five_layers, ftype, n_layers=5)}
    assert got == _expected([n for n, _, _ in five_layers], ftype, FIVE_LAYER_MIX[ftype])


@pytest.mark.parametrize("ftype", list(TWO_LAYER_MIX))
def test_policy_two_layers_dflash2(two_layers, ftype):
    names = [n for n, _, _ in two_layers]
    assert {"blk.1.attn_conv_base", "blk.0.ffn_conv_proj.weight", "selector_predecessor.weight"} <= set(names)
    choices = choose_types(two_layers, ftype, n_layers=2)
    assert [c.name for c in choices] == names  # file order kept
    assert {c.name: c.new_type for c in choices} == _expected(names, ftype, TWO_LAYER_MIX[ftype])
    assert not any(c.fallback for c in choices)


def test_use_more_bits_table():
    # by hand: n=5 -> {2, 4}; n=2 -> {1}; n=8 -> n/8=1, 7n/8=7: {0, 3, 6, 7}; n=12 -> 1, 10: {0, 3, 6, 9, 10, 11}
    assert [i for i in range(5) if use_more_bits(i, 5)] == [2, 4]
    assert [i for i in range(2) if use_more_bits(i, 2)] == [1]
    assert [i for i in range(8) if use_more_bits(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(12) if use_more_bits(i, 12)] == [0, 3, 6, 9, 10, 11]


# ---------------------------------------------------------------------------------------------------------
# Small synthetic tensor lists (numpy shapes: the last dim is the row length).
def _layer(i: int, h: int, ff: int, t: Q = Q.F16) -> list[tuple[str, tuple[int, ...], Q]]:
    p = f"blk.{i}."
    return [(p + "attn_norm.weight", (h,), Q.F32), (p + "attn_q.weight", (h, h), t), (p + "attn_v.weight", (h, h), t),
            (p + "ffn_down.weight", (h, ff), t), (p + "ffn_up.weight", (ff, h), t)]


def _model(n: int, h: int = 256, ff: int = 512, extra=()) -> list[tuple[str, tuple[int, ...], Q]]:
    t = [("fc.weight", (h, 2 * h), Q.F16), ("output_norm.weight", (h,), Q.F32), *extra]
    for i in range(n):
        t += _layer(i, h, ff)
    return t


def _types(choices) -> dict[str, Q]:
    return {c.name: c.new_type for c in choices}


def test_counters_follow_llama_order_not_file_order():
    # 12 layers, Q4_K_M: use_more_bits(i, 12) at {0, 3, 6, 9, 10, 11}. llama.cpp walks tensors by layer
    # number (blk.10 after blk.9), so a shuffled file gives the same types.
    tensors = _model(12)
    shuffled = tensors[:]
    random.Random(0).shuffle(shuffled)
    a, b = _types(choose_types(tensors, "Q4_K_M", n_layers=12)), _types(choose_types(shuffled, "Q4_K_M", n_layers=12))
    assert a == b
    assert [i for i in range(12) if a[f"blk.{i}.attn_v.weight"] == K6] == [0, 3, 6, 9, 10, 11]
    assert [i for i in range(12) if a[f"blk.{i}.ffn_down.weight"] == K6] == [0, 3, 6, 9, 10, 11]
    assert [c.name for c in choose_types(shuffled, "Q4_K_M", n_layers=12)] == [n for n, _, _ in shuffled]


@pytest.mark.parametrize(
    "ftype,width,wanted,got",
    [
        # tensor_type_fallback: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 when 256 does not divide the row,
        # then F16 when 32 does not divide it either; a 32-block type that does not fit goes to F16.
        ("Q4_K_S", 64, K4, Q.Q5_0),
        ("Q5_K_S", 64, K5, Q.Q5_1),
        ("Q6_K", 64, K6, Q.Q8_0),
        ("Q4_K_S", 72, K4, Q.F16),
        ("Q5_K_S", 72, K5, Q.F16),
        ("Q6_K", 72, K6, Q.F16),
        ("Q8_0", 72, Q.Q8_0, Q.F16),
    ],
)
def test_fallbacks(ftype, width, wanted, got):
    choices = choose_types([("blk.0.attn_q.weight", (8, width), Q.F32)], ftype, n_layers=1)
    (c,) = choices
    assert c.new_type == got and c.fallback_from == wanted
    assert f"row length {width}" in c.fallback and got.name in c.fallback


def test_no_fallback_when_rows_fit():
    for ftype in ("Q8_0", "Q4_K_M"):
        (c,) = choose_types([("blk.0.attn_q.weight", (8, 256), Q.F32)], ftype, n_layers=1)
        assert c.fallback is None and c.fallback_from is None
    # F16 / BF16 have a block of 1: never a fallback
    (c,) = choose_types([("blk.0.attn_q.weight", (8, 72), Q.F32)], "BF16", n_layers=1)
    assert c.new_type == Q.BF16 and c.fallback is None


def test_no_fallback_raises_one_line():
    with pytest.raises(DFlashError) as exc:
        choose_types([("blk.3.ffn_up.weight", (8, 64), Q.F32)], "Q4_K_M", n_layers=4, allow_fallback=False)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "blk.3.ffn_up.weight" in msg and "64" in msg and "Q4_K" in msg and "Q5_0" in msg and "--no-fallback" in msg


def test_kept_tensors():
    tensors = [
        ("blk.0.attn_q_norm.weight", (4, 256), Q.F32),   # 2-D norm: "_norm.weight" is never quantized
        ("blk.0.attn_v.weight", (1, 256), Q.F32),        # ggml_n_dims([256, 1]) == 1 -> 1-D
        ("blk.0.attn_conv_base", (2, 3, 256), Q.F32),    # does not end in "weight"
        ("position_embd.weight", (16, 256), Q.F32),      # excluded by name
        ("blk.0.ffn_gate_inp.weight", (8, 256), Q.F32),  # expert router
        ("blk.0.attn_k.weight", (64, 256), Q.F16),
    ]
    got = choose_types(tensors, "Q4_K_M", n_layers=1)
    assert [c.new_type for c in got] == [Q.F32, Q.F32, Q.F32, Q.F32, Q.F32, K4]
    assert all(c.reason.startswith("kept") for c in got[:5])


def test_output_and_tied_embeddings():
    h = 256
    untied = [("token_embd.weight", (512, h), Q.F16), ("output.weight", (512, h), Q.F16)] + _layer(0, h, 512)
    # output.weight: Q6_K unless the default is Q8_0; untied token_embd keeps the default
    assert _types(choose_types(untied, "Q4_K_M", n_layers=1))["output.weight"] == K6
    assert _types(choose_types(untied, "Q4_K_M", n_layers=1))["token_embd.weight"] == K4
    assert _types(choose_types(untied, "Q8_0", n_layers=1))["output.weight"] == Q.Q8_0
    # no output.weight: token_embd is the (tied) output -> Q6_K
    tied = [("token_embd.weight", (512, h), Q.F16)] + _layer(0, h, 512)
    assert _types(choose_types(tied, "Q5_K_S", n_layers=1))["token_embd.weight"] == K6
    # row not a multiple of the block: Q8_0 by the output rule, not a fallback
    (c,) = choose_types([("output.weight", (512, 64), Q.F16)], "Q4_K_M", n_layers=1)
    assert c.new_type == Q.Q8_0 and c.fallback is None and "Q8_0" in c.reason
    # --pure: the default type everywhere, output included
    assert set(_types(choose_types(untied, "Q4_K_M", n_layers=1, pure=True)).values()) == {K4, Q.F32}


def test_pure_five_layers():
    # --pure skips llama_tensor_get_type_impl: every quantizable tensor gets the default type
    got = _types(choose_types(_model(5), "Q4_K_M", n_layers=5, pure=True))
    assert {n: t for n, t in got.items() if t != Q.F32} == {n: K4 for n, _, _ in _model(5) if not n.endswith("norm.weight")}


def test_overrides():
    o = [parse_tensor_type_override("blk\\.0\\.attn_v=q8_0"), parse_tensor_type_override("ATTN_V=Q5_K")]
    got = choose_types(_model(5), "Q4_K_M", n_layers=5, overrides=o)
    t = _types(got)
    # first match wins; the pattern is lower-cased like llama-quantize's parse_tensor_type
    assert t["blk.0.attn_v.weight"] == Q.Q8_0
    assert [t[f"blk.{i}.attn_v.weight"] for i in range(1, 5)] == [K5] * 4
    assert "--tensor-type" in next(c for c in got if c.name == "blk.1.attn_v.weight").reason
    # overridden tensors skip the mix and its counter: with blk.0 overridden, blk.1..4 get attn_v counters 0..3
    # (n_attention_wv still 5) -> use_more_bits(2, 5) lands on blk.3, not blk.2 / blk.4 (llama.cpp quirk).
    t = _types(choose_types(_model(5), "Q4_K_M", n_layers=5, overrides=[o[0]]))
    assert [t[f"blk.{i}.attn_v.weight"] for i in range(5)] == [Q.Q8_0, K4, K4, K6, K4]
    # an override still falls back when its block does not fit
    (c,) = choose_types([("blk.0.attn_q.weight", (8, 64), Q.F32)], "Q8_0", n_layers=1,
                        overrides=[parse_tensor_type_override("attn_q=q6_k")])
    assert c.new_type == Q.Q8_0 and c.fallback_from == K6
    # llama.cpp applies overrides only when the file type's default is quantized
    t = _types(choose_types(_model(2), "F16", n_layers=2, overrides=[o[0]]))
    assert t["blk.0.attn_v.weight"] == Q.F16


def test_eight_experts():
    # n_expert == 8: attn_v -> Q8_0; attn_output -> Q5_K for Q4_K_*; ffn_down layer parsed from the name
    h = 256
    tensors = [("blk.0.attn_v.weight", (h, h), Q.F16), ("blk.0.attn_output.weight", (h, h), Q.F16),
               ("blk.0.attn_k.weight", (h, h), Q.F16), ("blk.1.ffn_down.weight", (h, 512), Q.F16)]
    t = _types(choose_types(tensors, "Q4_K_M", n_layers=2, n_expert=8))
    assert t == {"blk.0.attn_v.weight": Q.Q8_0, "blk.0.attn_output.weight": K5, "blk.0.attn_k.weight": Q.Q8_0,
                 "blk.1.ffn_down.weight": K6}  # use_more_bits(1, 2)


def test_file_types_and_parsing():
    # llama.h's LLAMA_FTYPE_* values and llama_ftype_get_default_type
    assert {n: (f.file_type, f.default_type) for n, f in FILE_TYPES.items()} == {
        "Q8_0": (7, Q.Q8_0), "Q6_K": (18, K6), "Q5_K_M": (17, K5), "Q5_K_S": (16, K5), "Q5_1": (9, Q.Q5_1),
        "Q5_0": (8, Q.Q5_0), "Q4_K_M": (15, K4), "Q4_K_S": (14, K4), "Q4_1": (3, Q.Q4_1), "Q4_0": (2, Q.Q4_0),
        "IQ4_NL": (25, Q.IQ4_NL), "IQ4_XS": (30, Q.IQ4_XS), "Q3_K_L": (13, Q.Q3_K), "Q3_K_M": (12, Q.Q3_K),
        "Q3_K_S": (11, Q.Q3_K), "Q2_K": (10, Q.Q2_K), "Q2_K_S": (21, Q.Q2_K), "F16": (1, Q.F16), "BF16": (32, Q.BF16)}
    assert get_file_type("q4_k_m").name == "Q4_K_M"
    # llama-quantize's aliases
    assert [get_file_type(a).name for a in ("q3_k", "Q4_K", "q5_k")] == ["Q3_K_M", "Q4_K_M", "Q5_K_M"]
    for bad in ("IQ2_XXS", "", "q4", "Q1_0"):
        with pytest.raises(UsageError):
            get_file_type(bad)
    for spec in ("attn_v", "=q8_0", "attn_v=", "attn_v=q9_9", "attn_v=IQ2_XXS", "(=q8_0"):
        with pytest.raises(UsageError) as exc:
            parse_tensor_type_override(spec)
        assert "\n" not in str(exc.value)
