"""DSpark families (SpecForge/DeepSpec five architectures, speculators layout, Gemma-4 DSpark, DeepSeek-V4
refusal): dflash-convert against llama.cpp's converter.

Two kinds of check:
- the oracle tests run llama.cpp's ``convert_hf_to_gguf.py`` on each zoo fixture (skip without
  DFLASHKIT_LLAMA_CPP_SRC; its BPE pre-tokenizer hash lookup is bypassed for the tiny fixture tokenizer,
  see tests/llama_cpp_oracle.py) and require our file to be byte-identical, and require our refusals to
  carry llama.cpp's own reason;
- the pinned tests need no llama.cpp: every metadata key (type, value — long arrays by sha256) and every
  tensor (name, type, shape, sha256 of its bytes), in file order, as llama.cpp's converter wrote them for
  the same seeded fixture (tests/data/dspark_llama_cpp_outputs.json, taken from llama.cpp's converter
  output: llama-cpp-python 0.3.36 sdist, 2026-11-23).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import make_zoo
from llama_cpp_oracle import OUTTYPES, OracleError, compare_gguf, read_gguf, run_oracle

from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError

PINNED = json.loads((Path(__file__).parent / "data" / "dspark_llama_cpp_outputs.json").read_text())
CONVERTED = tuple(PINNED)  # the DSpark fixtures llama.cpp converts
REFUSED = ("spec-dspark-gated", "specforge-dspark-gated", "qwen3-dspark-d2t-dup", "deepseekv4-dspark")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    pytest.importorskip("dflash.model")
    pytest.importorskip("speculators.models.dspark")
    return make_zoo.make_zoo(tmp_path_factory.mktemp("zoo"), [*CONVERTED, *REFUSED])


def _convert(src: Path, out: Path, target: Path, outtype: str = "f32") -> Path:
    convert(src, out, outtype=outtype, target=target, progress=False, warn=lambda _: None)
    return out


def _digest(value: Any) -> Any:
    if isinstance(value, list) and len(value) > 16 or (isinstance(value, str) and len(value) > 80):
        return {"sha256": hashlib.sha256(json.dumps(value).encode()).hexdigest(), "len": len(value)}
    return value


def _listing(path: Path) -> dict[str, list]:
    meta, tensors = read_gguf(path)
    return {
        "metadata": [[k, t, _digest(v)] for k, t, v in meta],
        "tensors": [[n, t, list(s), hashlib.sha256(d).hexdigest()] for n, t, s, d in tensors],
    }


# --------------------------------------------------------------------------------------------
# pinned (no llama.cpp needed)


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("name", CONVERTED)
def test_convert_matches_pinned_llama_cpp_output(name: str, outtype: str, zoo, tmp_path: Path) -> None:
    target, made = zoo
    ours = _listing(_convert(made[name], tmp_path / f"{name}.gguf", target, outtype))
    want = PINNED[name][outtype]
    assert [m[0] for m in ours["metadata"]] == [m[0] for m in want["metadata"]]  # keys in llama.cpp's order
    assert ours["metadata"] == want["metadata"]
    assert [t[:3] for t in ours["tensors"]] == [t[:3] for t in want["tensors"]]  # names, types, shapes, order
    assert ours["tensors"] == want["tensors"]  # and the bytes


def test_d2t_is_written_as_absolute_ids(zoo, tmp_path: Path) -> None:
    # the stored offsets (target id = d2t[i] + i, speculators' convention) come back as the sorted target
    # ids t2d marks — checked against the checkpoint itself
    target, made = zoo
    stored = {k: v.numpy() for k, v in _stored(made["spec-dspark"]).items() if k in ("d2t", "t2d")}
    _, tensors = read_gguf(_convert(made["spec-dspark"], tmp_path / "s.gguf", target))
    by_name = {n: (t, s, d) for n, t, s, d in tensors}
    type_, shape, data = by_name["d2t"]
    assert (type_, shape) == ("I64", (256,))
    assert np.array_equal(np.frombuffer(data, dtype="<i8"), np.flatnonzero(stored["t2d"]))
    assert [n for n, *_ in tensors][-1] == "d2t" and "t2d" not in by_name


def test_full_vocab_dspark_has_no_output_head(zoo, tmp_path: Path) -> None:
    target, made = zoo
    _, tensors = read_gguf(_convert(made["specforge-dspark"], tmp_path / "s.gguf", target))
    names = [n for n, *_ in tensors]
    assert "output.weight" not in names and "d2t" not in names
    assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"} <= set(names)


# --------------------------------------------------------------------------------------------
# refusals

REFUSAL_MESSAGES = {
    "spec-dspark-gated": "{dir}/config.json: unsupported markov_head_type 'gated' (only 'vanilla' is supported) — "
                         "llama.cpp runs the vanilla Markov head only",
    "specforge-dspark-gated": "{dir}/config.json: unsupported markov_head_type 'gated' (only 'vanilla' is supported) — "
                              "llama.cpp runs the vanilla Markov head only",
    "qwen3-dspark-d2t-dup": "{dir}: d2t contains duplicate target ids (target id {dup} at rows [0, 1])",
    "deepseekv4-dspark": "{dir}/config.json: architecture 'DeepseekV4DSparkModel' is a DSpark drafter on a DeepSeek-V4 "
                         "backbone (MLA attention, hyper-connections, MoE); dflashkit does not convert DeepSeek-V4 "
                         "DSpark — llama.cpp's own converter (convert_hf_to_gguf.py) handles full DeepSeek-V4 checkpoints",
}


def _stored(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def _dup_id(directory: Path) -> int:
    return int(_stored(directory)["d2t"][0])  # row 0's absolute id = offset + 0


@pytest.mark.parametrize("name", REFUSED)
def test_refused_fixture_names_the_key(name: str, zoo, tmp_path: Path) -> None:
    target, made = zoo
    out = tmp_path / "out.gguf"
    with pytest.raises(DFlashError) as info:
        _convert(made[name], out, target)
    expected = REFUSAL_MESSAGES[name].format(dir=made[name], dup=_dup_id(made[name]) if "dup" in name else 0)
    assert str(info.value) == expected
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _edited(src: Path, dst: Path, *, config: dict[str, Any] | None = None, drop_keys: tuple[str, ...] = (),
            tensors: dict[str, Any] | None = None, drop_tensors: tuple[str, ...] = ()) -> Path:
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key in drop_keys:
        cfg.pop(key)
    cfg.update(config or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    if tensors or drop_tensors:
        data = {k: v for k, v in _stored(dst).items() if k not in drop_tensors}
        data.update(tensors or {})
        save_file(data, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _d2t_out_of_range(made: dict[str, Path]) -> dict[str, Any]:
    d2t = _stored(made["qwen3-dspark"])["d2t"].clone()
    d2t[-1] += 600  # the last row now names target id >= 512
    return {"d2t": d2t}


# (fixture, edit, our message, llama.cpp's message or None when llama.cpp accepts/cannot read it)
BAD_CONFIGS = {
    "no-transformer-layer-config": (
        "spec-dspark", dict(drop_keys=("transformer_layer_config",)),
        "{dir}/config.json: 'transformer_layer_config' is missing — a speculators checkpoint (speculators_model_type "
        "'dspark') keeps the drafter's hidden size, layers and heads there; re-save it with speculators' save_pretrained",
        None,  # llama.cpp: KeyError on the layer count
    ),
    "draft-vocab-larger-than-target": (
        "qwen3-dspark", dict(config={"draft_vocab_size": 600}),
        "{dir}/config.json: draft_vocab_size 600 exceeds vocab_size 512 — a draft vocabulary is a subset of the target's",
        "ValueError: draft_vocab_size 600 exceeds vocab_size 512",
    ),
    "d2t-out-of-range": (
        "qwen3-dspark", dict(tensors="out-of-range"),
        "{dir}: d2t target ids out of range for target vocab size 512 (1 of 256; first: row 255 → {last})",
        "ValueError: d2t target ids out of range for target vocab size 512",
    ),
    "no-d2t": (
        "qwen3-dspark", dict(drop_tensors=("d2t",)),
        "{dir}: draft_vocab_size 256 < vocab_size 512 but no d2t table found — a reduced draft vocabulary needs the "
        "checkpoint's d2t tensor (draft row → target id)",
        "ValueError: draft_vocab_size 256 < vocab_size 512 but no d2t table found",
    ),
    "d2t-size": (
        "qwen3-dspark", dict(tensors="short-d2t"),
        "{dir}: d2t size 255 does not match draft_vocab_size 256 — check config.json 'draft_vocab_size' against the "
        "checkpoint's d2t tensor",
        "ValueError: d2t size 255 does not match draft_vocab_size 256",
    ),
    "gemma4-k-eq-v": (
        "gemma4-dspark", dict(config={"attention_k_eq_v": False}),
        "{dir}/config.json: Gemma4 DSpark currently requires attention_k_eq_v ('attention_k_eq_v' is False)",
        "ValueError: Gemma4 DSpark currently requires attention_k_eq_v",
    ),
    "gemma4-markov-in-dflash-config": (
        "gemma4-dspark", dict(config={"dflash_config": {"block_size": 16, "mask_token_id": 500, "target_layer_ids": [1, 8],
                                                         "markov_head_type": "rnn"}}),
        "{dir}/config.json: Gemma4 DSpark currently requires a vanilla Markov head ('dflash_config.markov_head_type' is 'rnn')",
        "ValueError: Gemma4 DSpark currently requires a vanilla Markov head",
    ),
    "gemma4-no-global-head-dim": (
        "gemma4-dspark", dict(drop_keys=("global_head_dim",)),
        "{dir}/config.json: Gemma4 DSpark requires 'global_head_dim' (the full-attention layers' head geometry)",
        "KeyError: 'global_head_dim'",
    ),
    "gemma4-softcapping": (
        "gemma4-dspark", dict(config={"final_logit_softcapping": 30.0}),
        "{dir}/config.json: Gemma4 DSpark logit softcapping is not supported ('final_logit_softcapping' is 30.0)",
        "ValueError: Gemma4 DSpark logit softcapping is not supported",
    ),
    "gemma4-reduced-vocab": (
        "gemma4-dspark", dict(config={"draft_vocab_size": 256}),
        "{dir}/config.json: Gemma4 DSpark currently requires a full draft vocabulary (vocab_size 512) "
        "('draft_vocab_size' is 256)",
        "ValueError: Gemma4 DSpark currently requires a full draft vocabulary",
    ),
}


def _make_bad(case: str, made: dict[str, Path], root: Path) -> Path:
    fixture, edit, _, _ = BAD_CONFIGS[case]
    edit = dict(edit)
    if edit.get("tensors") == "out-of-range":
        edit["tensors"] = _d2t_out_of_range(made)
    elif edit.get("tensors") == "short-d2t":
        edit["tensors"] = {"d2t": _stored(made[fixture])["d2t"][:-1].clone()}
    return _edited(made[fixture], root / case, **edit)


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_bad_config_gives_one_line_error_naming_the_key(case: str, zoo, tmp_path: Path) -> None:
    target, made = zoo
    bad = _make_bad(case, made, tmp_path)
    with pytest.raises(DFlashError) as info:
        _convert(bad, tmp_path / "out.gguf", target)
    last = ""
    if case == "d2t-out-of-range":
        last = str(int(_stored(bad)["d2t"][-1]) + 255)
    assert str(info.value) == BAD_CONFIGS[case][2].format(dir=bad, last=last)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out.gguf").exists()


# --------------------------------------------------------------------------------------------
# oracle (llama.cpp's converter runs here)


@pytest.fixture(scope="module")
def oracle(zoo, tmp_path_factory: pytest.TempPathFactory, oracle_build: str):
    target, made = zoo
    root = tmp_path_factory.mktemp(f"oracle-{oracle_build}")
    cache: dict[tuple[str, str], Path] = {}

    def get(name: str, outtype: str) -> Path:
        if (name, outtype) not in cache:
            cache[name, outtype] = run_oracle(made[name], root / f"{name}-{outtype}.gguf", outtype=outtype,
                                              target_dir=target, build=oracle_build)
        return cache[name, outtype]

    return get


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("name", CONVERTED)
def test_convert_byte_identical_to_llama_cpp(name: str, outtype: str, zoo, oracle, tmp_path: Path) -> None:
    target, made = zoo
    reference = oracle(name, outtype)
    ours = _convert(made[name], tmp_path / f"{name}.gguf", target, outtype)
    assert compare_gguf(reference, ours, ordered=True) == []
    assert ours.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("name", CONVERTED)
def test_pinned_listing_is_what_llama_cpp_writes_today(name: str, oracle) -> None:
    # the pinned file above is llama.cpp's output for this very fixture (regenerate it when llama.cpp moves)
    assert _listing(oracle(name, "f32")) == PINNED[name]["f32"]


@pytest.mark.parametrize("name", REFUSED)
def test_llama_cpp_refuses_the_same_fixtures(name: str, zoo, oracle_build: str, tmp_path: Path) -> None:
    target, made = zoo
    with pytest.raises(OracleError) as info:
        run_oracle(made[name], tmp_path / "o.gguf", outtype="f32", target_dir=target, build=oracle_build)
    reason = info.value.message.split(": ", 1)[1]
    if name == "deepseekv4-dspark":
        assert reason == "max() arg is an empty sequence"  # our stub is no full DeepSeek-V4 checkpoint
        return
    with pytest.raises(DFlashError) as ours:
        _convert(made[name], tmp_path / "ours.gguf", target)
    assert reason in str(ours.value)  # llama.cpp's own reason, word for word


@pytest.mark.parametrize("case", [c for c, v in BAD_CONFIGS.items() if v[3] is not None])
def test_llama_cpp_refuses_the_same_bad_configs(case: str, zoo, oracle_build: str, tmp_path: Path) -> None:
    target, made = zoo
    bad = _make_bad(case, made, tmp_path)
    with pytest.raises(OracleError) as info:
        run_oracle(bad, tmp_path / "o.gguf", outtype="f32", target_dir=target, build=oracle_build)
    assert info.value.message == BAD_CONFIGS[case][3]
    with pytest.raises(DFlashError) as ours:
        _convert(bad, tmp_path / "ours.gguf", target)
    reason = BAD_CONFIGS[case][3].split(": ", 1)[1]
    assert reason.strip("'") in str(ours.value)


@pytest.mark.parametrize("name", ["spec-dspark", "gemma4-dspark"])
def test_translating_a_dspark_gguf_keeps_every_byte(name: str, zoo, tmp_path: Path) -> None:
    # GGUF -> GGUF (llama.cpp dialect): heads, d2t, rope_freqs and the DSpark keys survive untouched
    target, made = zoo
    first = _convert(made[name], tmp_path / "a.gguf", target)
    again = tmp_path / "b.gguf"
    convert(first, again, progress=False, warn=lambda _: None)
    assert again.read_bytes() == first.read_bytes()
