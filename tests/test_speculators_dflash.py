"""speculators DFlash / DFlash 2 checkpoints (written by speculators 0.9.0's own classes, fixtures/make_zoo.py).

llama.cpp's converter cannot read them under their own name (its DFlashModel does not merge
``transformer_layer_config``: KeyError on the layer count), so the expected file is the one llama.cpp's
loader reads — src/models/dflash.cpp + common/speculative.cpp — which is what llama.cpp's DSparkModel
writes for this config shape: with DFLASHKIT_LLAMA_CPP_SRC set, the checkpoint relabelled
``DSparkDraftModel`` is run through llama.cpp's converter and compared byte for byte (README
"speculators DFlash"). Without it, the values pinned below (from the fixture's config.json as
speculators saved it, and that oracle run) still hold; the d2t ids are checked against speculators' own
``t2d`` mask, the tensor bytes against the safetensors the speculators class wrote.
test_llama_cpp_interop.py runs the files in llama-speculative-simple when a build is present.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from dflashkit.cli import convert_command
from dflashkit.converters.convert import convert
from dflashkit.drafters import open_drafter
from dflashkit.errors import DFlashError
from dflashkit.families import family_for_config
from dflashkit.io.gguf_reader import open_gguf

import make_zoo

QUIET = dict(progress=False, warn=lambda m: None)
SPEC_FIXTURES = ["spec-dflash", "spec-dflash-fullvocab", "spec-dflash2"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    pytest.importorskip("speculators.models.dflash2")  # needs speculators' runtime deps (openai, datasets, ...)
    return make_zoo.make_zoo(tmp_path_factory.mktemp("speczoo"), SPEC_FIXTURES + ["zlab-dflash2"])


def _meta(path: Path) -> dict[str, tuple[V, object]]:
    g = open_gguf(path)
    try:
        return {k: (kv.type, kv.value) for k, kv in g.kvs.items()}
    finally:
        g.close()


def _tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    g = open_gguf(path)
    try:
        return {t.name: (t.ggml_type.name, tuple(t.shape)) for t in g.tensors.values()}
    finally:
        g.close()


def _layer_tensors(n_layers: int, *, dflash2: bool) -> dict[str, tuple[str, tuple[int, ...]]]:
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for i in range(n_layers):
        p = f"blk.{i}."
        out.update({
            p + "attn_norm.weight": ("F32", (64,)), p + "ffn_norm.weight": ("F32", (64,)),
            p + "attn_q.weight": ("F32", (64, 64)), p + "attn_k.weight": ("F32", (32, 64)),
            p + "attn_v.weight": ("F32", (32, 64)), p + "attn_output.weight": ("F32", (64, 64)),
            p + "attn_q_norm.weight": ("F32", (16,)), p + "attn_k_norm.weight": ("F32", (16,)),
            p + "ffn_gate.weight": ("F32", (128, 64)), p + "ffn_up.weight": ("F32", (128, 64)),
            p + "ffn_down.weight": ("F32", (64, 128)),
        })
        if dflash2:
            out.update({
                p + "attn_conv_base": ("F32", (2, 3, 64)), p + "attn_conv_proj.weight": ("F32", (24, 64)),
                p + "ffn_conv_base": ("F32", (2, 3, 64)), p + "ffn_conv_proj.weight": ("F32", (24, 64)),
            })
    return out


# The loader's keys (src/models/dflash.cpp, common/speculative.cpp) with the fixture's values:
# transformer_layer_config → hparams; aux_hidden_state_layer_ids [2, 9] are HF ids + 1 = llama.cpp's
# target_layers unchanged; block_size 8 (top level); mask id 500 (top level) → tokenizer.ggml.mask_token_id;
# sample_from_anchor false written (a missing key reads as true).
HPARAMS = {
    "general.architecture": (V.STRING, "dflash"),
    "dflash.context_length": (V.UINT32, 4096),
    "dflash.embedding_length": (V.UINT32, 64),
    "dflash.block_count": (V.UINT32, 2),
    "dflash.feed_forward_length": (V.UINT32, 128),
    "dflash.attention.head_count": (V.UINT32, 4),
    "dflash.attention.head_count_kv": (V.UINT32, 2),
    "dflash.attention.key_length": (V.UINT32, 16),
    "dflash.attention.value_length": (V.UINT32, 16),
    "dflash.rope.freq_base": (V.FLOAT32, 1000000.0),
    "dflash.block_size": (V.UINT32, 8),
    "dflash.target_layers": (V.ARRAY, [2, 9]),
    "tokenizer.ggml.mask_token_id": (V.UINT32, 500),
    "dflash.sample_from_anchor": (V.BOOL, False),
    "general.file_type": (V.UINT32, 0),
    "general.quantization_version": (V.UINT32, 2),
}
DFLASH2_KEYS = {
    "dflash.conv_kernel_size": (V.UINT32, 3),
    "dflash.conv_group_size": (V.UINT32, 16),
    "dflash.selector_rank": (V.UINT32, 8),
    "dflash.selector_top_k": (V.UINT32, 4),
}
GLOBAL = {
    "fc.weight": ("F32", (64, 128)),
    "enc.output_norm.weight": ("F32", (64,)),
    "output_norm.weight": ("F32", (64,)),
}
EXPECTED_TENSORS = {
    "spec-dflash": {**GLOBAL, **_layer_tensors(2, dflash2=False), "output.weight": ("F32", (256, 64)), "d2t": ("I64", (256,))},
    "spec-dflash-fullvocab": {**GLOBAL, **_layer_tensors(2, dflash2=False)},
    "spec-dflash2": {
        **GLOBAL, **_layer_tensors(2, dflash2=True),
        "selector_hidden.weight": ("F32", (8, 64)),
        "selector_predecessor.weight": ("F32", (512, 8)),
        "selector_successor.weight": ("F32", (512, 8)),
    },
}


ORACLE_CASES = [("spec-dflash", t) for t in ("f32", "f16", "bf16", "q8_0")] + [
    (n, t) for n in ("spec-dflash-fullvocab", "spec-dflash2") for t in ("f32", "q8_0")
]
#: what llama.cpp's DSparkModel writes that a DFlash file must not have, and what it leaves out that the
#: loader needs: has_confidence_head is DSpark's (common/speculative.cpp reads it for draft-dspark only);
#: DSparkModel reads the DFlash 2 conv keys from dflash_config only, which the speculators layout has not —
#: src/models/dflash.cpp refuses a DFlash 2 file without them ("DFlash2 model is missing conv/selector metadata")
ORACLE_ONLY = ("dflash.has_confidence_head",)
OURS_ONLY = ("dflash.conv_kernel_size", "dflash.conv_group_size", "dflash.selector_rank", "dflash.selector_top_k")


@pytest.mark.parametrize("name,outtype", ORACLE_CASES)
def test_same_bytes_as_llama_cpp_dspark_converter_on_the_same_config_shape(name: str, outtype: str, zoo,
                                                                         oracle_build: str, tmp_path: Path) -> None:
    """llama.cpp's converter fails on speculators DFlash (DFlashModel: KeyError on the layer count), but its
    DSparkModel reads exactly this layout (transformer_layer_config merged, aux ids - 1, d2t → absolute
    I64 last, t2d dropped, lm_head → output, sample_from_anchor): the same checkpoint relabelled
    DSparkDraftModel is converted by llama.cpp and must give our bytes, but for the DSpark-only key."""
    from llama_cpp_oracle import compare_gguf, require_llama_cpp_src, run_oracle

    require_llama_cpp_src(oracle_build)
    target, made = zoo
    relabelled = shutil.copytree(made[name], tmp_path / name)  # same directory name: same general.name
    config = json.loads((relabelled / "config.json").read_text())
    config["architectures"] = ["DSparkDraftModel"]
    (relabelled / "config.json").write_text(json.dumps(config))
    theirs = run_oracle(relabelled, tmp_path / "theirs.gguf", outtype=outtype, target_dir=target, build=oracle_build)
    ours = tmp_path / "ours.gguf"
    convert(made[name], ours, outtype=outtype, target=target, **QUIET)
    expected = [f"metadata {k}: only in a" for k in OURS_ONLY if name == "spec-dflash2"]
    expected += [f"metadata {k}: only in b" for k in ORACLE_ONLY]
    assert compare_gguf(ours, theirs, ordered=True) == expected


def _drafter_keys(meta: dict[str, tuple[V, object]]) -> dict[str, tuple[V, object]]:
    # the target's tokenizer keys and general.name/type/size_label are the converter's shared business
    return {k: v for k, v in meta.items() if k.startswith("dflash.") or k in HPARAMS}


@pytest.mark.parametrize("name", SPEC_FIXTURES)
def test_speculators_checkpoint_converts_to_what_llama_cpp_loads(name: str, zoo, tmp_path: Path) -> None:
    target, made = zoo
    out = tmp_path / "d.gguf"
    convert(made[name], out, outtype="f32", target=target, **QUIET)
    meta = _meta(out)
    expected = dict(HPARAMS)
    if name == "spec-dflash2":
        expected.update(DFLASH2_KEYS)
    got = _drafter_keys(meta)
    eps = got.pop("dflash.attention.layer_norm_rms_epsilon")
    assert eps[0] == V.FLOAT32 and eps[1] == pytest.approx(1e-6)
    assert got == expected
    assert "dflash.has_confidence_head" not in meta  # DSpark only
    assert meta["tokenizer.ggml.model"] == (V.STRING, "gpt2")  # the target's tokenizer
    assert _tensors(out) == EXPECTED_TENSORS[name]


def test_d2t_is_written_as_absolute_ids_matching_speculators_t2d(zoo, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    target, made = zoo
    out = tmp_path / "d.gguf"
    convert(made["spec-dflash"], out, outtype="bf16", target=target, **QUIET)
    stored = load_file(str(made["spec-dflash"] / "model.safetensors"))
    g = open_gguf(out)
    try:
        d2t = np.array(g.array("d2t"))
        head = np.array(g.array("output.weight"))
        assert g.tensors["d2t"].ggml_type == Q.I64  # I64 in every outtype, as the loader asserts
    finally:
        g.close()
    # speculators' own t2d mask marks exactly the target ids the draft rows map to
    assert d2t.tolist() == np.flatnonzero(stored["t2d"]).tolist()
    assert d2t.tolist() == (stored["d2t"] + np.arange(256)).tolist()
    assert head.dtype == np.uint16 and head.shape == (256, 64)  # bf16 bits of lm_head, rows = draft vocab
    import torch  # torch's bf16 rounding is the reference for the f32 → bf16 bytes

    want = torch.from_numpy(stored["lm_head.weight"]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(head, want)


def test_tensor_bytes_are_the_checkpoint_bytes(zoo, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    target, made = zoo
    out = tmp_path / "d.gguf"
    convert(made["spec-dflash"], out, outtype="f32", target=target, **QUIET)
    stored = load_file(str(made["spec-dflash"] / "model.safetensors"))
    g = open_gguf(out)
    try:
        for gguf_name, hf_name in (("output.weight", "lm_head.weight"), ("fc.weight", "fc.weight"),
                                   ("blk.1.attn_q.weight", "layers.1.self_attn.q_proj.weight")):
            assert np.array_equal(np.array(g.array(gguf_name)), stored[hf_name]), gguf_name
    finally:
        g.close()


def test_layout_is_told_by_config_shape_not_architecture(zoo) -> None:
    _, made = zoo
    for name, family in (("spec-dflash", "speculators-dflash"), ("spec-dflash2", "speculators-dflash2"),
                         ("zlab-dflash2", "zlab-dflash2")):
        config = json.loads((made[name] / "config.json").read_text())
        assert family_for_config(config).name == family
    # same architecture string for both layouts
    assert json.loads((made["spec-dflash2"] / "config.json").read_text())["architectures"] == ["DFlash2DraftModel"]
    with open_drafter(made["spec-dflash"]) as d:
        assert d.spec is not None and d.spec.target_layer_ids == (1, 8)  # HF convention: aux ids - 1
        assert d.spec.layout == "speculators" and d.spec.draft_vocab_size == 256 and d.spec.sample_from_anchor is False
        assert d.dropped == ["t2d"] and not d.unmapped


# ---- bad configs: one line, exit 1, naming the key ---------------------------------------------


def _copy(src: Path, dst: Path, edit=None, tensors=None) -> Path:
    shutil.copytree(src, dst)
    if edit is not None:
        path = dst / "config.json"
        config = json.loads(path.read_text())
        edit(config)
        path.write_text(json.dumps(config))
    if tensors is not None:
        from safetensors.numpy import load_file, save_file

        st = dst / "model.safetensors"
        data = load_file(str(st))
        for name, value in tensors(data).items():
            if value is None:
                del data[name]
            else:
                data[name] = value
        save_file(data, str(st), metadata={"format": "pt"})
    return dst


def _bad_d2t_range(data):
    d2t = data["d2t"].copy()
    d2t[-1] = 512 - 255  # absolute id 512: one past the last target token
    return {"d2t": d2t}


def _bad_d2t_dup(data):
    d2t = data["d2t"].copy()
    d2t[1] = d2t[0] - 1  # row 1 maps to row 0's id
    return {"d2t": d2t}


BAD = {
    "no-layer-config": ("spec-dflash", lambda c: c.pop("transformer_layer_config"), None,
                        "speculators config without 'transformer_layer_config' — the drafter's hparams live there "
                        "(re-save the checkpoint with speculators)"),
    # no type key either: the speculators tap key still tells the layout (not z-lab's "hidden_size is missing")
    "no-layer-config-no-type": ("spec-dflash", lambda c: [c.pop("transformer_layer_config"), c.pop("speculators_model_type")],
                                None, "speculators config without 'transformer_layer_config'"),
    "no-hidden": ("spec-dflash", lambda c: c["transformer_layer_config"].pop("hidden_size"), None,
                  "required key 'transformer_layer_config.hidden_size' is missing"),
    "layer-type": ("spec-dflash", lambda c: c["transformer_layer_config"].update(model_type="mamba"), None,
                   "transformer_layer_config.model_type 'mamba' is not supported (known: qwen3, qwen2, llama)"),
    "no-taps": ("spec-dflash", lambda c: c.pop("aux_hidden_state_layer_ids"), None,
                "'aux_hidden_state_layer_ids' is missing — the target layers this drafter taps are unknown"),
    "draft-vocab-too-large": ("spec-dflash", lambda c: c.update(draft_vocab_size=600), None,
                              "'draft_vocab_size' 600 is larger than the target vocabulary "
                              "(transformer_layer_config.vocab_size 512)"),
    "anchor-dflash2": ("spec-dflash2", lambda c: c.update(sample_from_anchor=True), None,
                       "'sample_from_anchor' is true, but speculators DFlash 2 requires false (the anchor slot holds "
                       "the bonus token) — set \"sample_from_anchor\": false"),
    "d2t-range": ("spec-dflash", None, _bad_d2t_range,
                  "d2t target ids out of range for target vocab size 512 (1 of 256; first: row 255 → 512)"),
    "d2t-dup": ("spec-dflash", None, _bad_d2t_dup,
                "d2t contains duplicate target ids (target id"),
    "d2t-missing": ("spec-dflash", None, lambda data: {"d2t": None},
                    "missing tensor(s) for this config: d2t"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_speculators_config_is_one_line_naming_the_key(case: str, zoo, tmp_path: Path) -> None:
    target, made = zoo
    fixture, edit, tensors, message = BAD[case]
    src = _copy(made[fixture], tmp_path / "src", edit, tensors)
    out = tmp_path / "o.gguf"
    r = CliRunner().invoke(convert_command, [str(src), str(out), "--target", str(target), "-q"])
    assert r.exit_code == 1, r.output
    line = r.stderr.strip()
    assert line.count("\n") == 0 and "Traceback" not in r.output
    assert line.startswith(f"error: {src}") and message in line, line
    assert not out.exists()


def test_d2t_offsets_become_llama_cpp_absolute_ids(zoo) -> None:
    # zoo-oracle.md §1.2, measured with llama.cpp's DSpark converter: stored [1, 1, 11, 12, 12] → [1, 2, 13, 15, 16]
    from dflashkit.families.speculators_dflash import DFLASH

    with open_drafter(zoo[1]["spec-dflash"]) as d:
        spec = replace(d.require_spec(), vocab_size=20, draft_vocab_size=5)
    data, ggml_type = DFLASH.finalize_tensor(spec, "d2t", np.array([1, 1, 11, 12, 12]), "x")
    assert data.tolist() == [1, 2, 13, 15, 16] and ggml_type == Q.I64


def test_diff_maps_the_speculators_tensors_and_compares_d2t_exactly(zoo, tmp_path: Path) -> None:
    from test_inspect_drafter import rewrite_gguf

    from dflashkit.diff import diff_drafters

    target, made = zoo
    out = tmp_path / "d.gguf"
    convert(made["spec-dflash"], out, outtype="f32", target=target, **QUIET)
    result = diff_drafters(made["spec-dflash"], out)
    assert not result.only_one_side and not result.unmapped and not result.shape_mismatches and not result.unreadable
    assert "lm_head.weight" in {t.canonical for t in result.tensors}  # lm_head ↔ output.weight
    assert all(t.stats.max_abs_diff == 0 for t in result.tensors)
    # HF offsets vs GGUF absolute ids: compared exactly after the offset → absolute step
    assert [(e.canonical, e.n_different) for e in result.exact] == [("d2t", 0)]
    assert result.meaning_differences == [], result.meaning_differences
    # one id moved to a free target id is a difference, reported with its row and both ids
    g = open_gguf(out)
    try:
        d2t = np.array(g.array("d2t"))
    finally:
        g.close()
    free, original = int(np.setdiff1d(np.arange(512), d2t)[0]), int(d2t[0])
    d2t[0] = free
    edited = rewrite_gguf(out, tmp_path / "edited.gguf", replace={"d2t": d2t})
    exact = diff_drafters(made["spec-dflash"], edited).exact
    assert [(e.canonical, e.n_different, e.first) for e in exact] == [("d2t", 1, (0, original, free))]


@pytest.mark.parametrize("name", SPEC_FIXTURES)
def test_inspect_passes_the_checkpoint_and_its_gguf(name: str, zoo, tmp_path: Path) -> None:
    from dflashkit.inspect import inspect_paths

    target, made = zoo
    out = tmp_path / "d.gguf"
    convert(made[name], out, outtype="q8_0", target=target, **QUIET)
    for path in (made[name], out):
        report = inspect_paths([str(path)], target=str(target))
        errors = [f.message for f in report.files[0].findings if f.severity.value != "info"]
        assert errors == [] and report.exit_code(strict=True) == 0, errors


@pytest.mark.parametrize("name", ["spec-dflash", "spec-dflash2"])
def test_translating_the_gguf_keeps_every_byte(name: str, zoo, tmp_path: Path) -> None:
    # the GGUF carries no trace of the HF layout: sample_from_anchor false and d2t must survive a re-read
    target, made = zoo
    out, again = tmp_path / "d.gguf", tmp_path / "again.gguf"
    convert(made[name], out, outtype="q8_0", target=target, **QUIET)
    convert(out, again, **QUIET)
    assert _meta(again)["dflash.sample_from_anchor"] == (V.BOOL, False)
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize("dialect", ["luce", "dflash-draft"])
def test_a_reduced_draft_vocabulary_needs_the_llama_cpp_dialect(zoo, dialect: str, tmp_path: Path) -> None:
    # only llama.cpp's loader reads d2t: the other dialects have no name for it, so the file is refused, not
    # written without the map (its draft rows would be read as target ids)
    target, made = zoo
    with pytest.raises(DFlashError, match=f"tensor 'd2t' cannot be stored in the {dialect} dialect"):
        convert(made["spec-dflash"], tmp_path / "d.gguf", outtype="f16", target=target, dialect=dialect, **QUIET)
    assert not (tmp_path / "d.gguf").exists()
