"""dflash-diff on DSpark drafters: the heads are compared per tensor, d2t exactly (any difference fails, after
the HF side's offsets are made absolute as conversion does), and what conversion drops (t2d, a full-vocabulary
lm_head) or derives from the config (Gemma-4's rope_freqs) is not reported as missing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import make_zoo
from test_inspect_drafter import rewrite_gguf

from dflashkit.converters.convert import convert
from dflashkit.diff import diff_drafters

NAMES = ("spec-dspark", "specforge-dspark", "gemma4-dspark")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Path]]:
    pytest.importorskip("dflash.model")
    pytest.importorskip("speculators.models.dspark")
    root = tmp_path_factory.mktemp("dspark-diff")
    target, made = make_zoo.make_zoo(root / "zoo", list(NAMES))
    out = {}
    for name, src in made.items():
        for outtype in ("f32", "q8_0"):
            convert(src, root / f"{name}-{outtype}.gguf", outtype=outtype, target=target, progress=False, warn=lambda _: None)
        out[name] = (src, root / f"{name}-f32.gguf", root / f"{name}-q8_0.gguf")
    return out


def test_hf_vs_gguf_is_identical_with_d2t_equal_after_the_offsets(pairs) -> None:
    from safetensors.torch import load_file

    src, f32, _ = pairs["spec-dspark"]
    r = diff_drafters(src, f32)
    assert r.failures() == [] and r.exit_code() == 0
    assert r.only_one_side == [] and r.unmapped == [] and r.shape_mismatches == []
    assert all(t.stats.identical for t in r.tensors)
    assert [(e.canonical, e.n_different, e.a.type_name, e.b.type_name) for e in r.exact] == [("d2t", 0, "I64", "I64")]
    assert "d2t" not in {t.canonical for t in r.tensors}  # never an RMS
    # the stored offsets are not the GGUF's ids: equality above needed the offset -> absolute step
    import gguf

    stored = load_file(str(src / "model.safetensors"))["d2t"].numpy()
    written = np.asarray(next(t for t in gguf.GGUFReader(f32).tensors if t.name == "d2t").data)
    assert not np.array_equal(stored, written)
    assert np.array_equal(stored + np.arange(stored.size), written)
    assert [(i.key, i.a) for i in r.info if i.key == "dropped by conversion"] == [("dropped by conversion", "t2d")]


def test_heads_are_compared_per_tensor(pairs) -> None:
    src, _, q8 = pairs["spec-dspark"]
    r = diff_drafters(src, q8)
    by_id = {t.canonical: t for t in r.tensors}
    for canonical, gguf_name, gguf_type in (
        ("markov_head.markov_w1.weight", "markov_w1.weight", "F16"),  # q8_0 falls back: ne0 = rank 16
        ("markov_head.markov_w2.weight", "markov_w2.weight", "F16"),
        ("confidence_head.proj.weight", "conf_proj.weight", "F16"),  # ne0 = 80
        ("confidence_head.proj.bias", "conf_proj.bias", "F32"),
        ("lm_head.weight", "output.weight", "Q8_0"),
    ):
        t = by_id[canonical]
        assert (t.b.name, t.b.type_name) == (gguf_name, gguf_type)
        if gguf_type == "F32":
            assert t.stats.identical
        else:
            assert 0 < t.rel_rms < {"F16": 1e-3, "Q8_0": 1e-2}[gguf_type]
    assert r.exit_code() == 0  # no --threshold: quantization error alone does not fail


def test_one_changed_d2t_id_fails_the_diff(pairs, tmp_path: Path) -> None:
    import gguf

    src, f32, _ = pairs["spec-dspark"]
    d2t = np.asarray(next(t for t in gguf.GGUFReader(f32).tensors if t.name == "d2t").data).copy()
    original = int(d2t[7])
    d2t[7] = 511 if original != 511 else 510
    bad = rewrite_gguf(f32, tmp_path / "bad.gguf", replace={"d2t": d2t})
    r = diff_drafters(src, bad)
    assert r.failures() == ["1 integer tensor(s) differ (d2t)"]
    assert r.exit_code() == 1
    (e,) = r.exact
    assert (e.n_different, e.first) == (1, (7, original, int(d2t[7])))


def test_full_vocab_and_gemma4_dspark_diff_clean(pairs) -> None:
    src, f32, _ = pairs["specforge-dspark"]
    r = diff_drafters(src, f32)
    assert r.failures() == [] and r.exact == []
    src, f32, _ = pairs["gemma4-dspark"]
    r = diff_drafters(src, f32)
    assert r.failures() == []
    rope = {t.canonical: t for t in r.tensors}["rope_freqs.weight"]
    assert rope.a.name == "(from config.json)" and rope.stats.identical
    assert {t.canonical for t in r.tensors} >= {"layers.0.post_attention_norm.weight", "layers.1.layer_scalar.weight"}
