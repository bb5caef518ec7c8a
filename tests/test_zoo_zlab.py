"""Every z-lab DFlash variant of the zoo converted as llama.cpp's converter converts it (issue 13).

Variants (fixtures/make_zoo.py, written by z-lab's own ``dflash`` classes): YaRN in rope_parameters and
in rope_scaling, linear RoPE, interleaved RoPE (``rope_is_neox_style: false``), gelu, attention sinks,
MiMo (``attention_sink_bias`` + ``mask_embedding.pt``), self-contained (own embed_tokens / lm_head),
DFlash 2, and a config without target_layer_ids.

Two kinds of test:
- with DFLASHKIT_LLAMA_CPP_SRC: llama.cpp's converter runs here as the oracle and dflash-convert's
  output must be the same bytes, for f32/f16/bf16/q8_0;
- always: the metadata and tensor listing pinned from that oracle run (tests/zoo_zlab_expected.py),
  plus tensor data checked against the checkpoint files themselves.

Two deliberate deviations from the oracle, compared with that one key left out:
- zlab-gelu: llama.cpp's DFlashModel writes no activation key, so its file silently runs as SiLU
  (llama.cpp's loader defaults to SiLU); its loader honours ``dflash.hidden_activation``, which
  dflash-convert writes ("gelu_pytorch_tanh").
- zlab-no-taps: llama.cpp writes no ``dflash.target_layers`` (and its loader then refuses the file);
  dflash-convert refuses the config until ``--target-layer-ids`` supplies them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import make_zoo
from llama_cpp_oracle import OUTTYPES, compare_gguf, read_gguf, run_oracle
from zoo_zlab_expected import PINNED

from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError

VARIANTS = [
    "zlab-yarn-rope-parameters", "zlab-yarn-rope-scaling", "zlab-linear-rope", "zlab-interleaved", "zlab-gelu",
    "zlab-sinks", "zlab-mimo", "zlab-self-contained", "zlab-dflash2", "zlab-no-taps",
]
#: the flag zlab-no-taps needs (make_zoo's taps)
NO_TAPS_FLAG = list(make_zoo.TAPS)
#: keys where dflash-convert deviates from llama.cpp on purpose (see the module docstring)
DEVIATIONS = {"zlab-gelu": ("dflash.hidden_activation",), "zlab-no-taps": ("dflash.target_layers",)}
QUIET = dict(progress=False, warn=lambda m: None)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    pytest.importorskip("dflash.model")
    return make_zoo.make_zoo(tmp_path_factory.mktemp("zoo"), VARIANTS)


def ours(zoo, name: str, out: Path, outtype: str) -> Path:
    target, made = zoo
    extra = {"target_layer_ids": NO_TAPS_FLAG} if name == "zlab-no-taps" else {}
    convert(made[name], out, outtype=outtype, target=target, **QUIET, **extra)
    return out


# ---- the oracle ------------------------------------------------------------------------------


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("name", VARIANTS)
def test_byte_identical_to_llama_cpp(name: str, outtype: str, zoo, oracle_build: str, tmp_path: Path) -> None:
    target, made = zoo
    oracle = run_oracle(made[name], tmp_path / "oracle.gguf", outtype=outtype, target_dir=target, build=oracle_build)
    mine = ours(zoo, name, tmp_path / "ours.gguf", outtype)
    deviations = DEVIATIONS.get(name, ())
    assert compare_gguf(oracle, mine, ordered=True, ignore_keys=deviations) == []
    if not deviations:
        assert mine.read_bytes() == oracle.read_bytes()


# ---- pinned from the oracle run (no llama.cpp needed) --------------------------------------------


def _listing(path: Path) -> tuple[list[tuple[str, str, object]], list[tuple[str, str, list[int]]]]:
    meta, tensors = read_gguf(path)
    meta = [m for m in meta if not m[0].startswith("tokenizer.") or m[0] == "tokenizer.ggml.mask_token_id"]
    return meta, [(n, t, list(shape)) for n, t, shape, _ in tensors]


def _expected_metadata(name: str) -> list[tuple[str, str, object]]:
    expected = list(PINNED[name][0])
    if name == "zlab-gelu":  # our one addition (module docstring), after the DFlash keys
        at = [k for k, _, _ in expected].index("general.quantization_version")
        expected.insert(at, ("dflash.hidden_activation", "STRING", "gelu_pytorch_tanh"))
    if name == "zlab-no-taps":  # the flag's taps, + 1, where llama.cpp writes target_layers
        at = [k for k, _, _ in expected].index("dflash.block_size") + 1
        expected.insert(at, ("dflash.target_layers", "ARRAY[INT32]", [i + 1 for i in NO_TAPS_FLAG]))
    return expected


@pytest.mark.parametrize("name", VARIANTS)
def test_metadata_and_tensors_as_llama_cpp_writes_them(name: str, zoo, tmp_path: Path) -> None:
    meta, tensors = _listing(ours(zoo, name, tmp_path / "f32.gguf", "f32"))
    assert meta == _expected_metadata(name)
    pinned = [line.split(" ") for line in PINNED[name][1]]
    assert [(n, t) for n, t, _ in tensors] == [(p[0], p[1]) for p in pinned]
    assert [" ".join(str(d) for d in shape) for _, _, shape in tensors] == [
        " ".join(p[3:]).strip("[]").replace(",", "") for p in pinned
    ]
    _, q8 = _listing(ours(zoo, name, tmp_path / "q8.gguf", "q8_0"))
    assert [(n, t) for n, t, _ in q8] == [(p[0], p[2]) for p in pinned]


def _safetensors(directory: Path) -> dict[str, np.ndarray]:
    import torch
    from safetensors.torch import load_file

    return {k: v.to(torch.float32).numpy() for k, v in load_file(str(directory / "model.safetensors")).items()}


def _tensors(path: Path) -> dict[str, np.ndarray]:
    _, tensors = read_gguf(path)
    return {n: np.frombuffer(data, np.float32).reshape(tuple(reversed(shape))) for n, t, shape, data in tensors if t == "F32"}


def test_interleaved_rope_is_permuted_to_neox(zoo, tmp_path: Path) -> None:
    # per head: even dims first, then odd (llama.cpp: reshape(-1, head_dim/2, 2, ...).transpose(1, 2))
    _, made = zoo
    src = _safetensors(made["zlab-interleaved"])
    got = _tensors(ours(zoo, "zlab-interleaved", tmp_path / "i.gguf", "f32"))
    head_dim = 16
    for hf, gg in (("q_proj.weight", "attn_q.weight"), ("k_proj.weight", "attn_k.weight"),
                   ("q_norm.weight", "attn_q_norm.weight"), ("k_norm.weight", "attn_k_norm.weight")):
        raw = src[f"layers.1.self_attn.{hf}"]
        heads = raw.reshape(-1, head_dim, *raw.shape[1:])
        neox = np.concatenate([heads[:, 0::2], heads[:, 1::2]], axis=1).reshape(raw.shape)
        assert np.array_equal(got[f"blk.1.{gg}"], neox), hf
        assert not np.array_equal(got[f"blk.1.{gg}"], raw), hf
    assert np.array_equal(got["blk.1.attn_v.weight"], src["layers.1.self_attn.v_proj.weight"])  # v untouched


@pytest.mark.parametrize("name, hf", [("zlab-sinks", "sinks"), ("zlab-mimo", "attention_sink_bias")])
def test_sinks_are_copied_as_f32(name: str, hf: str, zoo, tmp_path: Path) -> None:
    _, made = zoo
    src = _safetensors(made[name])
    got = _tensors(ours(zoo, name, tmp_path / "s.gguf", "bf16"))  # 1-D: F32 in every outtype
    for layer in (0, 1):
        assert np.array_equal(got[f"blk.{layer}.attn_sinks.weight"], src[f"layers.{layer}.self_attn.{hf}"])


def test_mimo_mask_row_comes_from_mask_embedding_pt(zoo, tmp_path: Path) -> None:
    import torch

    target, made = zoo
    got = _tensors(ours(zoo, "zlab-mimo", tmp_path / "m.gguf", "f32"))
    tgt = _safetensors(target)
    mask = torch.load(made["zlab-mimo"] / "mask_embedding.pt", weights_only=True)
    mask_id = make_zoo.MASK_TOKEN_ID
    emb = got["token_embd.weight"]
    assert np.array_equal(np.delete(emb, mask_id, axis=0), np.delete(tgt["model.embed_tokens.weight"], mask_id, axis=0))
    # cast to the target embeddings' dtype first, as llama.cpp does
    from safetensors.torch import load_file

    dtype = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"].dtype
    assert np.array_equal(emb[mask_id], mask["embedding"].to(dtype).float().numpy())
    assert not np.array_equal(emb[mask_id], tgt["model.embed_tokens.weight"][mask_id])
    assert np.array_equal(got["output.weight"], tgt["lm_head.weight"])  # the target does not tie


def _mimo_copy(zoo, tmp_path: Path, **mask_fields) -> Path:
    import shutil

    import torch

    _, made = zoo
    d = tmp_path / "mimo"
    shutil.copytree(made["zlab-mimo"], d)
    mask = torch.load(d / "mask_embedding.pt", weights_only=True)
    mask.update(mask_fields)
    torch.save(mask, d / "mask_embedding.pt")
    return d


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"mask_token_id": 7}, "mask_embedding.pt mask_token_id does not match dflash_config"),
        ({"embedding": "zeros32"}, "mask_embedding.pt has an unexpected embedding shape"),
    ],
)
def test_mimo_checks_as_llama_cpp(fields: dict, message: str, zoo, tmp_path: Path) -> None:
    import torch

    if fields.get("embedding") == "zeros32":
        fields = {"embedding": torch.zeros(32)}
    d = _mimo_copy(zoo, tmp_path, **fields)
    target, _ = zoo
    with pytest.raises(DFlashError) as info:
        convert(d, tmp_path / "o.gguf", outtype="f32", target=target, **QUIET)
    assert str(info.value) == f"{d / 'mask_embedding.pt'}: {message}"
    assert not (tmp_path / "o.gguf").exists()


def test_mimo_needs_the_target_dir(zoo, tmp_path: Path) -> None:
    _, made = zoo
    with pytest.raises(DFlashError) as info:
        convert(made["zlab-mimo"], tmp_path / "o.gguf", outtype="f32", **QUIET)
    assert str(info.value) == (
        f"{made['zlab-mimo'] / 'mask_embedding.pt'}: mask_embedding.pt requires --target with the target's HF "
        "directory (its embeddings and output head)"
    )


def test_no_taps_is_an_error_naming_the_flag(zoo, tmp_path: Path) -> None:
    target, made = zoo
    with pytest.raises(DFlashError) as info:
        convert(made["zlab-no-taps"], tmp_path / "o.gguf", outtype="f32", target=target, **QUIET)
    # the example follows the config's shape (12 target layers, 2 drafter layers)
    assert str(info.value) == (
        f"{made['zlab-no-taps'] / 'config.json'}: no target_layer_ids (dflash_config or top level), so the target "
        "layers this drafter taps are unknown — pass them from its model card or training config: "
        "--target-layer-ids 1,9"
    )


def test_yarn_spellings_give_the_same_metadata(zoo, tmp_path: Path) -> None:
    # transformers 5 rope_parameters and transformers 4 rope_scaling + rope_theta (llama.cpp: identical)
    a, _ = _listing(ours(zoo, "zlab-yarn-rope-parameters", tmp_path / "a.gguf", "f32"))
    b, _ = _listing(ours(zoo, "zlab-yarn-rope-scaling", tmp_path / "b.gguf", "f32"))
    assert [m for m in a if m[0] != "general.name"] == [m for m in b if m[0] != "general.name"]


@pytest.mark.parametrize("name", ["zlab-yarn-rope-scaling", "zlab-linear-rope", "zlab-gelu", "zlab-interleaved", "zlab-self-contained"])
def test_round_trips_through_the_other_dialects_keep_every_byte(name: str, zoo, tmp_path: Path) -> None:
    # HF -> luce -> dflash-draft -> llama.cpp == HF -> llama.cpp: rope scaling and the activation ride
    # along as extension keys, the permuted q/k and the own embeddings/head as tensors
    target, made = zoo
    direct = ours(zoo, name, tmp_path / "direct.gguf", "bf16")
    luce = tmp_path / "luce.gguf"
    convert(made[name], luce, outtype="bf16", target=target, dialect="luce", **QUIET)
    convert(luce, tmp_path / "dd.gguf", dialect="dflash-draft", **QUIET)
    convert(tmp_path / "dd.gguf", tmp_path / "back.gguf", dialect="llama.cpp", **QUIET)
    assert (tmp_path / "back.gguf").read_bytes() == direct.read_bytes()


def test_sinks_exist_only_in_the_llama_cpp_dialect(zoo, tmp_path: Path) -> None:
    target, made = zoo
    with pytest.raises(DFlashError) as info:
        convert(made["zlab-sinks"], tmp_path / "o.gguf", outtype="bf16", target=target, dialect="luce", **QUIET)
    assert str(info.value) == "tensor 'layers.0.self_attn.sinks' cannot be stored in the luce dialect (it has no name for it)"


def _with_config(zoo, tmp_path: Path, name: str, **changes) -> Path:
    import json
    import shutil

    _, made = zoo
    d = tmp_path / name
    shutil.copytree(made[name], d)
    config = json.loads((d / "config.json").read_text())
    config.update(changes)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize("is_causal", [False, True])
def test_causal_flag_where_llama_cpp_writes_it(is_causal: bool, zoo, tmp_path: Path) -> None:
    # llama.cpp's TextModel writes a False is_causal right after head_count_kv and DFlashModel's second
    # write keeps that position; True is written only by DFlashModel, after target_layers. Pinned from
    # the oracle run; byte identity checked below when the oracle is available.
    target, _ = zoo
    d = _with_config(zoo, tmp_path, "zlab-yarn-rope-parameters", is_causal=is_causal)
    out = tmp_path / "ours.gguf"
    convert(d, out, outtype="f32", target=target, **QUIET)
    keys = [k for k, _, _ in read_gguf(out)[0]]
    after = "dflash.attention.head_count_kv" if not is_causal else "dflash.target_layers"
    assert keys[keys.index(after) + 1] == "dflash.attention.causal"
    assert {k: v for k, _, v in read_gguf(out)[0]}["dflash.attention.causal"] is is_causal
    from llama_cpp_oracle import llama_cpp_src

    if llama_cpp_src() is not None:
        oracle = run_oracle(d, tmp_path / "oracle.gguf", outtype="f32", target_dir=target)
        assert out.read_bytes() == oracle.read_bytes()
