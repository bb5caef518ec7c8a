"""dflash-convert: metadata, tensor bytes, tokenizer, and every error case (message + no output)."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from conftest import FAMILIES, target_for
from dflashkit.cli import convert_command
from dflashkit.converters.convert import convert
from dflashkit.dialects import tap_ids_from_llama_cpp, tap_ids_to_llama_cpp
from dflashkit.errors import DFlashError

import make_drafters

U32, F32 = V.UINT32, V.FLOAT32


def _hparams(ctx, embd, blocks, ff, heads, kv, hd, theta):
    return {
        "dflash.context_length": (U32, ctx),
        "dflash.embedding_length": (U32, embd),
        "dflash.block_count": (U32, blocks),
        "dflash.feed_forward_length": (U32, ff),
        "dflash.attention.head_count": (U32, heads),
        "dflash.attention.head_count_kv": (U32, kv),
        "dflash.attention.key_length": (U32, hd),
        "dflash.attention.value_length": (U32, hd),
        "dflash.attention.layer_norm_rms_epsilon": (F32, 1e-6),
        "dflash.rope.freq_base": (F32, theta),
    }


# Expected llama.cpp-dialect metadata per family, written out from the fixture configs by hand
# (target_layers are the HF ids + 1).
EXPECTED_METADATA: dict[str, dict[str, tuple[V, object]]] = {
    "qwen3-b16": {
        **_hparams(4096, 64, 2, 128, 4, 2, 16, 1e6),
        "dflash.block_size": (U32, 16),
        "dflash.target_layers": (V.INT32, [2, 9]),
        "tokenizer.ggml.mask_token_id": (U32, 500),
    },
    "qwen35-swa": {
        **_hparams(4096, 64, 3, 128, 4, 2, 16, 1e7),
        "dflash.block_size": (U32, 16),
        "dflash.target_layers": (V.INT32, [2, 5, 10]),
        "tokenizer.ggml.mask_token_id": (U32, 500),
        "dflash.attention.sliding_window": (U32, 8),
        "dflash.attention.sliding_window_pattern": (V.BOOL, [True, True, False]),
        # no is_causal: z-lab runs the sliding layers causal, llama.cpp's one flag (absent) none: recorded
        "dflashkit.attention.causal_layers": (V.BOOL, [True, True, False]),
    },
    "gemma4": {
        **_hparams(4096, 72, 5, 96, 3, 1, 24, 1e4),
        "dflash.block_size": (U32, 16),
        "dflash.target_layers": (V.INT32, [2, 4, 6, 8, 10]),
        "tokenizer.ggml.mask_token_id": (U32, 4),
        "dflash.attention.sliding_window": (U32, 16),
        "dflash.attention.sliding_window_pattern": (V.BOOL, [True, True, True, True, False]),
        "dflashkit.attention.causal_layers": (V.BOOL, [True, True, True, True, False]),
        "dflash.final_logit_softcapping": (F32, 30.0),
        "dflash.embedding_scale": (F32, 8.48528137423857),
    },
    "dflash2": {
        **_hparams(4096, 64, 2, 128, 4, 2, 16, 1e6),
        "dflash.block_size": (U32, 16),
        "dflash.target_layers": (V.INT32, [3, 8]),
        "tokenizer.ggml.mask_token_id": (U32, 500),
        "dflash.conv_kernel_size": (U32, 3),
        "dflash.conv_group_size": (U32, 16),
        "dflash.selector_rank": (U32, 8),
        "dflash.selector_top_k": (U32, 4),
    },
    "optional": {
        **_hparams(4096, 64, 3, 128, 4, 2, 16, 5e5),
        "dflash.block_size": (U32, 8),
        # top-level target_layer_ids [1, 5, 9] (+1 in llama.cpp's convention)
        "dflash.target_layers": (V.INT32, [2, 6, 10]),
        "tokenizer.ggml.mask_token_id": (U32, 500),
        "dflash.attention.sliding_window": (U32, 32),
        "dflash.attention.sliding_window_pattern": (V.BOOL, [True, True, True]),
        "dflash.attention.causal": (V.BOOL, True),
        "dflash.logit_scale": (F32, 0.5),
        "dflash.attention.value_scale": (F32, 0.75),
        "dflash.rope.dimension_count": (U32, 8),
    },
    "sharded": {
        **_hparams(4096, 64, 3, 128, 4, 2, 16, 1e6),
        "dflash.block_size": (U32, 16),
        "dflash.target_layers": (V.INT32, [1, 6, 10]),
        "tokenizer.ggml.mask_token_id": (U32, 500),
    },
}

# general.type and general.size_label as llama.cpp's converter writes them (issue 13: byte identity)
GENERAL = {
    "general.architecture", "general.type", "general.name", "general.size_label", "general.file_type",
    "general.quantization_version",
}

# HF name → llama.cpp name for every tensor kind, as the issue lists them.
LLAMA_CPP_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
}


def llama_cpp_name(hf: str) -> str:
    if hf.startswith("layers."):
        _, i, rest = hf.split(".", 2)
        return f"blk.{i}.{LLAMA_CPP_NAMES[rest]}"
    return LLAMA_CPP_NAMES[hf]


def read_safetensors(directory: Path) -> dict[str, tuple[str, np.ndarray]]:
    """Independent reader for the fixture files: name → (dtype tag, raw array)."""
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        header.pop("__metadata__", None)
        base = 8 + n
        for name, info in header.items():
            a, b = info["data_offsets"]
            dt = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}[info["dtype"]]
            out[name] = (info["dtype"], np.frombuffer(raw[base + a : base + b], dtype=dt).reshape(info["shape"]))
    return out


def as_f32(tag: str, arr: np.ndarray) -> np.ndarray:
    return (arr.astype(np.uint32) << 16).view(np.float32) if tag == "BF16" else arr.astype(np.float32)


def read_fields(path: Path) -> dict[str, tuple[list[V], object]]:
    r = gguf.GGUFReader(path)
    return {k: (f.types, f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}


def tensor_bytes(path: Path) -> dict[str, tuple[Q, list[int], bytes]]:
    r = gguf.GGUFReader(path)
    return {t.name: (Q(t.tensor_type), [int(d) for d in t.shape], np.asarray(t.data).tobytes()) for t in r.tensors}


def dir_digest(directory: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(directory.rglob("*")):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


# ----------------------------------------------------------------------------------------------


def test_tap_ids_to_llama_cpp_adds_one_and_round_trips() -> None:
    assert tap_ids_to_llama_cpp([1, 16, 31, 46, 61]) == [2, 17, 32, 47, 62]
    assert tap_ids_from_llama_cpp([2, 17, 32, 47, 62]) == [1, 16, 31, 46, 61]


@pytest.mark.parametrize("family", FAMILIES)
def test_metadata_exact(family: str, drafters, targets, tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    convert(drafters[family], out, outtype="f32", target=target_for(family, targets), progress=False)
    fields = read_fields(out)
    drafter_keys = {k: v for k, v in fields.items() if not k.startswith("tokenizer.") or k == "tokenizer.ggml.mask_token_id"}
    expected = EXPECTED_METADATA[family]
    assert set(drafter_keys) == set(expected) | GENERAL
    for key, (vtype, value) in expected.items():
        types, got = fields[key]
        if isinstance(value, list):
            assert types == [V.ARRAY, vtype], key
            assert list(got) == value, key
        else:
            assert types == [vtype], key
            if vtype == F32:
                assert got == pytest.approx(np.float32(value), rel=0, abs=0), key
            else:
                assert got == value, key
    assert fields["general.architecture"][1] == "dflash"
    assert fields["general.type"] == ([V.STRING], "model")
    assert fields["general.file_type"] == ([U32], 0)
    assert fields["general.quantization_version"] == ([U32], 2)
    # tokenizer copied from the target GGUF: model, tokens, merges ...
    assert fields["tokenizer.ggml.model"][1] == "gpt2"
    assert len(fields["tokenizer.ggml.tokens"][1]) == make_target.VOCAB_SIZE


import make_target  # noqa: E402


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("outtype", ["f32", "bf16", "f16", "q8_0"])
def test_tensor_bytes(family: str, outtype: str, drafters, targets, tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    convert(drafters[family], out, outtype=outtype, target=target_for(family, targets), progress=False)
    src = read_safetensors(drafters[family])
    got = tensor_bytes(out)
    assert set(got) == {llama_cpp_name(n) for n in src}
    for name, (tag, raw) in src.items():
        gtype, gshape, data = got[llama_cpp_name(name)]
        assert gshape == list(raw.shape[::-1]), name  # GGUF dims are reversed
        x = as_f32(tag, raw)
        if raw.ndim == 1 or not name.endswith(".weight") and "codebook" not in name:
            want_type, want = Q.F32, x.tobytes()  # 1-D tensors and conv bases always F32
        elif outtype == "f32":
            want_type, want = Q.F32, x.tobytes()
        elif outtype == "bf16":
            want_type, want = Q.BF16, (raw.tobytes() if tag == "BF16" else gguf.quants.quantize(x, Q.BF16).tobytes())
        elif outtype == "f16" or raw.shape[-1] % 32:
            want_type, want = Q.F16, x.astype(np.float16).tobytes()
        else:
            want_type, want = Q.Q8_0, gguf.quants.quantize(x, Q.Q8_0).tobytes()
        assert gtype == want_type, name
        assert data == want, name


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "sharded"])  # "sharded" is stored f16
def test_f16_through_the_bf16_kernel_writes_numpys_bytes(family: str, drafters, targets, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Large bf16 → f16 jobs take the one-pass numba kernel (`FAST_F16_MIN_VALUES`, lowered here so a fixture
    takes it): the file is byte-identical to the small-job path's (numpy's astype, gguf-py's bytes)."""
    from dflashkit.converters import convert as convert_module

    small, large = tmp_path / "numpy.gguf", tmp_path / "kernel.gguf"
    convert(drafters[family], small, outtype="f16", target=target_for(family, targets), progress=False)
    calls: list[int] = []
    import dflashkit.codecs as codecs

    real = codecs.bf16_bits_to_f16_bits
    monkeypatch.setattr(codecs, "bf16_bits_to_f16_bits", lambda raw, **kw: calls.append(raw.size) or real(raw, **kw))
    monkeypatch.setattr(convert_module, "FAST_F16_MIN_VALUES", 0)
    convert(drafters[family], large, outtype="f16", target=target_for(family, targets), progress=False)
    src = read_safetensors(drafters[family])
    bf16_matrices = sum(raw.size for tag, raw in src.values() if tag == "BF16" and raw.ndim == 2)
    assert sum(calls) == bf16_matrices > 0  # every bf16 matrix went through the kernel
    assert large.read_bytes() == small.read_bytes()


def test_auto_outtype_follows_checkpoint(drafters, tmp_path: Path) -> None:
    a = convert(drafters["qwen3-b16"], tmp_path / "a.gguf", progress=False, warn=lambda m: None)
    b = convert(drafters["sharded"], tmp_path / "b.gguf", progress=False, warn=lambda m: None)
    assert (a.outtype, a.file_type) == ("bf16", 32)
    assert (b.outtype, b.file_type) == ("f16", 1)
    assert tensor_bytes(tmp_path / "b.gguf")["fc.weight"][0] == Q.F16


def test_hf_dir_target_builds_tokenizer(drafters, targets, tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    convert(drafters["qwen3-b16"], out, outtype="bf16", target=targets[64]["hf"], progress=False)
    from_hf = {k: v for k, v in read_fields(out).items() if k.startswith("tokenizer.")}
    out2 = tmp_path / "d2.gguf"
    convert(drafters["qwen3-b16"], out2, outtype="bf16", target=targets[64]["gguf"], progress=False)
    from_gguf = {k: v for k, v in read_fields(out2).items() if k.startswith("tokenizer.")}
    assert from_hf == from_gguf
    assert from_hf["tokenizer.ggml.pre"][1] == "qwen2"
    assert from_hf["tokenizer.ggml.mask_token_id"] == ([U32], 500)


def test_no_target_warns_loudly_and_writes_file_without_tokenizer(drafters, tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    warnings: list[str] = []
    convert(drafters["qwen3-b16"], out, progress=False, warn=warnings.append)
    assert out.exists()
    assert not any(k.startswith("tokenizer.ggml.model") for k in read_fields(out))
    assert any("llama.cpp will refuse to load it" in w and "--target" in w for w in warnings)


def test_sharded_checkpoint_is_read_across_shards(drafters, tmp_path: Path) -> None:
    out = tmp_path / "s.gguf"
    convert(drafters["sharded"], out, outtype="f32", progress=False, warn=lambda m: None)
    assert len(tensor_bytes(out)) == len(read_safetensors(drafters["sharded"]))


def test_inputs_are_never_modified(drafters, targets, tmp_path: Path) -> None:
    before = dir_digest(drafters["dflash2"]), targets[64]["gguf"].read_bytes()
    convert(drafters["dflash2"], tmp_path / "x.gguf", outtype="q8_0", target=targets[64]["gguf"], progress=False)
    assert (dir_digest(drafters["dflash2"]), targets[64]["gguf"].read_bytes()) == before


# ---- errors: message names the file/tensor/key, and no OUT (nor temp file) is left -----------


def _copy_family(drafters, family: str, dest: Path) -> Path:
    import shutil

    shutil.copytree(drafters[family], dest)
    return dest


def _edit_config(directory: Path, **changes) -> None:
    cfg = json.loads((directory / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (directory / "config.json").write_text(json.dumps(cfg))


def _expect_error(src, out: Path, match: str, *, exc=DFlashError, **kwargs) -> str:
    kwargs.setdefault("progress", False)
    kwargs.setdefault("warn", lambda m: None)
    with pytest.raises(exc) as info:
        convert(src, out, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    assert match in msg, msg
    assert not out.exists()
    assert leftovers(out.parent) == []
    return msg


def test_unknown_tensor_is_an_error_listing_it(drafters, tmp_path: Path) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    tensors = {k: ("F32", as_f32(*v)) for k, v in read_safetensors(d).items()}
    tensors["layers.0.mlp.extra_gate.weight"] = ("F32", np.zeros((4, 64), np.float32))
    tensors["mystery"] = ("F32", np.zeros(3, np.float32))
    make_drafters.write_safetensors(d / "model.safetensors", tensors)
    msg = _expect_error(d, tmp_path / "o.gguf", "2 tensor name(s) dflashkit does not know")
    assert "layers.0.mlp.extra_gate.weight" in msg and "mystery" in msg


def test_missing_tensor_is_named(drafters, tmp_path: Path) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    tensors = read_safetensors(d)
    del tensors["layers.1.self_attn.k_norm.weight"]
    make_drafters.write_safetensors(d / "model.safetensors", tensors)
    _expect_error(d, tmp_path / "o.gguf", "missing tensor(s) for this config: layers.1.self_attn.k_norm.weight")


def test_shape_mismatch_names_field_tensor_and_numbers(drafters, tmp_path: Path) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    _edit_config(d, num_key_value_heads=4)
    msg = _expect_error(d, tmp_path / "o.gguf", "tensor 'layers.0.self_attn.k_proj.weight' has shape [32, 64]")
    assert "num_key_value_heads 4 × head_dim 16 = 64 rows" in msg


def test_fc_width_mismatch(drafters, tmp_path: Path) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    _edit_config(d, dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 5, 8]})
    _expect_error(d, tmp_path / "o.gguf", "3 target_layer_ids × hidden_size 64 = 192 input columns")


def test_layer_count_mismatch(drafters, tmp_path: Path) -> None:
    d = _copy_family(drafters, "qwen35-swa", tmp_path / "d")
    _edit_config(d, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    _expect_error(d, tmp_path / "o.gguf", "num_hidden_layers = 2 but the highest layer tensor is layers.2 (3 layers)")


def test_missing_shard(drafters, tmp_path: Path) -> None:
    d = _copy_family(drafters, "sharded", tmp_path / "d")
    (d / "model-00002-of-00003.safetensors").unlink()
    _expect_error(d, tmp_path / "o.gguf", "model-00002-of-00003.safetensors")


@pytest.mark.parametrize("cut", [1, 100])
def test_truncated_checkpoint(drafters, tmp_path: Path, cut: int) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-cut])
    _expect_error(d, tmp_path / "o.gguf", "model.safetensors")


def test_refuses_to_overwrite_without_force(drafters, tmp_path: Path) -> None:
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(DFlashError, match="already exists — pass --force"):
        convert(drafters["qwen3-b16"], out, progress=False, warn=lambda m: None)
    assert out.read_bytes() == b"keep me"
    convert(drafters["qwen3-b16"], out, progress=False, warn=lambda m: None, force=True)
    assert out.read_bytes()[:4] == b"GGUF"


def test_mask_token_outside_target_vocab(drafters, targets, tmp_path: Path) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    _edit_config(d, dflash_config={"mask_token_id": 600, "target_layer_ids": [1, 8]})
    _expect_error(d, tmp_path / "o.gguf", "mask_token_id 600 is outside the target vocabulary (512 tokens)", target=targets[64]["gguf"])


def test_tap_past_target_last_layer(drafters, targets, tmp_path: Path) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    _edit_config(d, num_target_layers=None, dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 11]})
    _expect_error(d, tmp_path / "o.gguf", "target layer id 11 taps layer 12 but the target has 12 layers", target=targets[64]["gguf"])


def test_hidden_size_mismatch(drafters, targets, tmp_path: Path) -> None:
    _expect_error(drafters["qwen3-b16"], tmp_path / "o.gguf", "target hidden size 72 ≠ drafter hidden_size 64", target=targets[72]["gguf"])


def test_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _expect_error(tmp_path / "empty", tmp_path / "o.gguf", "no config.json")
    _expect_error(tmp_path / "nope", tmp_path / "o.gguf", "no such directory")


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"architectures": ["LlamaForCausalLM"]}, "architecture 'LlamaForCausalLM' is not a DFlash drafter"),
        ({"hidden_size": None}, "required key 'hidden_size' is missing"),
        ({"rope_theta": None}, "required key 'rope_theta' is missing"),
        ({"num_attention_heads": 3}, "num_attention_heads (3) must be a multiple of num_key_value_heads (2)"),
        ({"dflash_config": {"mask_token_id": 500, "target_layer_ids": [8, 1]}}, "must be sorted and unique"),
        # issue 13: no default tap rule any more; the message names the flag (example from the dimensions)
        ({"dflash_config": {"mask_token_id": 500}, "num_target_layers": None},
         "config.json: no target_layer_ids (dflash_config or top level), so the target layers this drafter taps are "
         "unknown — pass them from its model card or training config: --target-layer-ids 1,9,17,25,33"),
        ({"dflash_config": {"mask_token_id": 500, "target_layer_ids": [1, 12]}}, "target layer id 12 is past the target's last layer"),
        ({"block_size": "16"}, "'block_size' must be an integer"),
    ],
)
def test_config_errors(drafters, tmp_path: Path, changes, match) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    _edit_config(d, **changes)
    _expect_error(d, tmp_path / "o.gguf", match)


def test_missing_taps_need_the_flag(drafters, targets, tmp_path: Path) -> None:
    # issue 13: a config without target_layer_ids is an error naming --target-layer-ids (the example
    # has the config's shape: 12 target layers, 2 drafter layers), and the flag supplies them
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    _edit_config(d, dflash_config={"mask_token_id": 500})
    msg = _expect_error(d, tmp_path / "o.gguf", "no target_layer_ids")
    assert msg == (
        f"{d / 'config.json'}: no target_layer_ids (dflash_config or top level), so the target layers this drafter "
        "taps are unknown — pass them from its model card or training config: --target-layer-ids 1,9"
    )
    convert(d, tmp_path / "o.gguf", target_layer_ids=[1, 8], target=targets[64]["gguf"], progress=False, warn=lambda m: None)
    assert read_fields(tmp_path / "o.gguf")["dflash.target_layers"][1] == [2, 9]
    # the same checkpoint's own taps: the flag may repeat them, never contradict them
    convert(drafters["qwen3-b16"], tmp_path / "same.gguf", target_layer_ids=[1, 8], progress=False, warn=lambda m: None)
    msg = _expect_error(drafters["qwen3-b16"], tmp_path / "x.gguf", "contradicts", target_layer_ids=[1, 9])
    assert msg.endswith("config.json: --target-layer-ids 1,9 contradicts the config's target_layer_ids [1, 8]")


def test_cli_target_layer_ids(drafters, tmp_path: Path) -> None:
    d = _copy_family(drafters, "qwen3-b16", tmp_path / "d")
    _edit_config(d, dflash_config={"mask_token_id": 500})
    r = CliRunner().invoke(convert_command, [str(d), str(tmp_path / "o.gguf"), "-q"])
    assert r.exit_code == 1 and r.output.strip().endswith("--target-layer-ids 1,9"), r.output
    r = CliRunner().invoke(convert_command, [str(d), str(tmp_path / "o.gguf"), "-q", "--target-layer-ids", "8,1"])
    assert r.exit_code == 2
    assert r.output == "error: --target-layer-ids: give sorted, unique, non-negative layer ids (e.g. 1,9,17,25,33), got '8,1'\n"
    r = CliRunner().invoke(convert_command, [str(d), str(tmp_path / "o.gguf"), "-q", "--target-layer-ids", "1,8"])
    assert r.exit_code == 0, r.output
    assert read_fields(tmp_path / "o.gguf")["dflash.target_layers"][1] == [2, 9]


def test_failure_mid_write_leaves_no_output(drafters, tmp_path: Path, monkeypatch) -> None:
    import dflashkit.converters.convert as conv

    def boom(*_args, **_kwargs):
        raise DFlashError("simulated failure while writing")

    monkeypatch.setattr(conv, "_convert_chunk", boom)
    _expect_error(drafters["qwen3-b16"], tmp_path / "o.gguf", "simulated failure")


def test_dflash2_refused_in_a_dialect_without_its_tensors(drafters, tmp_path: Path) -> None:
    _expect_error(drafters["dflash2"], tmp_path / "o.gguf", "cannot be written in the luce dialect", dialect="luce")


# ---- hub sources through huggingface_hub's offline cache -----------------------------------


def _fake_hub_cache(cache: Path, repo_id: str, files_from: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in files_from.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())


def test_hub_repo_id_from_offline_cache(drafters, tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    _fake_hub_cache(cache, "z-lab/Tiny-DFlash-b16", drafters["qwen3-b16"])
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    out = tmp_path / "hub.gguf"
    convert("z-lab/Tiny-DFlash-b16", out, outtype="f32", progress=False, warn=lambda m: None)
    direct = tmp_path / "direct.gguf"
    convert(drafters["qwen3-b16"], direct, outtype="f32", progress=False, warn=lambda m: None)
    assert tensor_bytes(out) == tensor_bytes(direct)
    _expect_error("z-lab/Not-Cached", tmp_path / "o.gguf", "z-lab/Not-Cached: not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    # provenance (issue 13): repo id and commit from the cache path, in gguf-py's general.source.* keys;
    # general.name is the repo id, as llama.cpp names a --remote conversion
    fields = read_fields(out)
    assert fields["general.name"][1] == "z-lab/Tiny-DFlash-b16"
    assert fields["general.source.url"] == (
        [V.STRING], "https://huggingface.co/z-lab/Tiny-DFlash-b16/tree/0123456789abcdef0123456789abcdef01234567"
    )
    assert fields["general.source.repo_url"] == ([V.STRING], "https://huggingface.co/z-lab/Tiny-DFlash-b16")
    keys = list(fields)
    assert keys.index("general.size_label") < keys.index("general.source.url") < keys.index("general.source.repo_url") < keys.index("dflash.block_count")


def test_source_flags_record_provenance_of_a_local_dir(drafters, tmp_path: Path) -> None:
    out = tmp_path / "p.gguf"
    convert(drafters["qwen3-b16"], out, outtype="f32", source_repo="z-lab/Qwen3-8B-DFlash-b16", source_revision="v1.0", progress=False, warn=lambda m: None)
    fields = read_fields(out)
    assert fields["general.name"][1] == "Qwen3 B16"  # llama.cpp's heuristic name of the directory
    assert fields["general.source.url"][1] == "https://huggingface.co/z-lab/Qwen3-8B-DFlash-b16/tree/v1.0"
    assert fields["general.source.repo_url"][1] == "https://huggingface.co/z-lab/Qwen3-8B-DFlash-b16"
    plain = tmp_path / "plain.gguf"
    convert(drafters["qwen3-b16"], plain, outtype="f32", progress=False, warn=lambda m: None)
    assert not any(k.startswith("general.source") for k in read_fields(plain))  # what llama.cpp writes
    _expect_error(drafters["qwen3-b16"], tmp_path / "o.gguf", "--source-revision needs --source-repo", source_revision="v1.0")
    _expect_error(drafters["qwen3-b16"], tmp_path / "o.gguf", "--source-repo 'nope' is not a hub repo id (owner/name)", source_repo="nope")


# ---- CLI: exit codes and one-line errors ------------------------------------------------------


def test_cli_json_summary(drafters, targets, tmp_path: Path) -> None:
    out = tmp_path / "c.gguf"
    r = CliRunner().invoke(convert_command, [str(drafters["gemma4"]), str(out), "--target", str(targets[72]["gguf"]), "--outtype", "q8_0", "--json", "-q"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["tensor_count"] == len(read_safetensors(drafters["gemma4"]))
    assert summary["metadata"]["dflash.target_layers"] == [2, 4, 6, 8, 10]
    # gemma4's 72-wide rows cannot be Q8_0: F16, reported per tensor
    by_name = {t["name"]: t for t in summary["tensors"]}
    assert by_name["fc.weight"]["type"] == "F16"  # rows of 5 × 72 = 360
    assert by_name["blk.0.ffn_down.weight"]["type"] == "Q8_0"  # rows of 96
    notes = [t for t in summary["tensors"] if t.get("note")]
    assert notes and all("not a multiple of 32: F16 instead of Q8_0" in t["note"] for t in notes)


def test_cli_exit_codes(drafters, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(convert_command, [str(tmp_path / "missing"), str(tmp_path / "o.gguf")])
    assert r.exit_code == 1
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: ")
    assert "Traceback" not in r.output
    r = runner.invoke(convert_command, [str(drafters["qwen3-b16"]), str(tmp_path / "o.txt")])
    assert r.exit_code == 2 and "must be a .gguf path" in r.stderr
    r = runner.invoke(convert_command, [str(drafters["qwen3-b16"])])
    assert r.exit_code == 2
    r = runner.invoke(convert_command, [str(drafters["qwen3-b16"]), str(tmp_path / "o.gguf"), "--outtype", "q3"])
    assert r.exit_code == 2


def test_cli_warns_without_target(drafters, tmp_path: Path) -> None:
    r = CliRunner().invoke(convert_command, [str(drafters["qwen3-b16"]), str(tmp_path / "o.gguf")])
    assert r.exit_code == 0
    assert "llama.cpp will refuse to load it" in r.stderr


def test_console_script_installed(drafters, tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "dflash-convert"
    assert exe.exists(), "pip install the package: the dflash-convert entry point is missing"
    r = subprocess.run([str(exe), str(drafters["qwen3-b16"]), str(tmp_path / "o.gguf"), "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_mrope_target_gives_temporal_rope_sections(drafters, tmp_path: Path) -> None:
    # Qwen3.5/3.6 targets rope with M-RoPE sections; the drafter ropes on the temporal one only,
    # which llama.cpp's converter writes as [head_dim / 2, 0, 0, 0]
    hf = make_target.make_hf_target(tmp_path / "t", hidden_size=64, n_layers=12)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e7, "mrope_section": [11, 11, 10]}
    (hf / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "d.gguf"
    convert(drafters["qwen35-swa"], out, outtype="bf16", target=hf, progress=False)
    assert read_fields(out)["dflash.rope.dimension_sections"] == ([V.ARRAY, V.INT32], [8, 0, 0, 0])
    # a GGUF target carrying sections is recognised too, and a plain target gives none
    plain = tmp_path / "p.gguf"
    convert(drafters["qwen35-swa"], plain, outtype="bf16", target=make_target.make_hf_target(tmp_path / "p", hidden_size=64, n_layers=12), progress=False)
    assert "dflash.rope.dimension_sections" not in read_fields(plain)


def test_special_values_round_as_ggml(drafters, tmp_path: Path) -> None:
    # f32 checkpoint with NaN (with payload), ±inf, -0, subnormals and halfway cases
    d = tmp_path / "d"
    import shutil

    shutil.copytree(drafters["qwen3-b16"], d)
    tensors = {k: ("F32", as_f32(*v)) for k, v in read_safetensors(d).items()}
    special = np.array(
        [0x7FC00001, 0xFFC12345, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x3F808000, 0x3F818000],
        dtype=np.uint32,
    ).view(np.float32)
    w = tensors["fc.weight"][1].copy()
    w.reshape(-1)[: special.size] = special
    tensors["fc.weight"] = ("F32", w)
    make_drafters.write_safetensors(d / "model.safetensors", tensors)
    convert(d, tmp_path / "b.gguf", outtype="bf16", progress=False, warn=lambda m: None)
    convert(d, tmp_path / "h.gguf", outtype="f16", progress=False, warn=lambda m: None)
    u = w.reshape(-1).view(np.uint32)
    # ggml_compute_fp32_to_bf16: NaN -> quiet NaN keeping sign and top payload, else round to nearest even
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    want_bf16 = np.where(nan, (u >> 16) | 64, (u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    got_bf16 = np.frombuffer(tensor_bytes(tmp_path / "b.gguf")["fc.weight"][2], dtype=np.uint16)
    assert np.array_equal(got_bf16, want_bf16)
    assert got_bf16[0] == 0x7FC0 | 64 and got_bf16[1] == 0xFFC1 | 64  # NaN stays NaN, sign kept
    got_f16 = np.frombuffer(tensor_bytes(tmp_path / "h.gguf")["fc.weight"][2], dtype=np.float16)
    assert np.isnan(got_f16[:2]).all() and np.signbit(got_f16[1])
    finite = ~np.isnan(w.reshape(-1))
    assert np.array_equal(got_f16[finite].view(np.uint16), w.reshape(-1)[finite].astype(np.float16).view(np.uint16))
