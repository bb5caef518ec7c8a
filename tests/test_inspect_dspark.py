"""dflash-inspect on DSpark GGUFs: the family is recognised and its heads checked (d2t I64 / unique / in range /
as long as the output head; Markov and confidence shapes as llama.cpp's loader creates them). Broken files are
good conversions rewritten with gguf-py's GGUFWriter, one thing changed each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as V

import make_zoo
from test_inspect_drafter import findings, rewrite_gguf

from dflashkit.converters.convert import convert


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("dflash.model")
    pytest.importorskip("speculators.models.dspark")
    root = tmp_path_factory.mktemp("dspark")
    target, made = make_zoo.make_zoo(root / "zoo", ["spec-dspark", "specforge-dspark"])
    out = {}
    for name, src in made.items():
        out[name] = root / f"{name}.gguf"
        convert(src, out[name], outtype="f32", target=target, progress=False, warn=lambda _: None)
    return out


def _tensor(path: Path, name: str) -> np.ndarray:
    import gguf

    return np.asarray(next(t for t in gguf.GGUFReader(path).tensors if t.name == name).data).copy()


def _ids(found: dict[str, list]) -> set[str]:
    return {i for i, fs in found.items() if any(f.severity.value != "info" for f in fs)}


def test_good_dspark_files_pass_and_name_the_family(good) -> None:
    f = findings(good["spec-dspark"])
    assert _ids(f) == set()
    assert [x.message for x in f["dspark.family"]] == [
        f"{good['spec-dspark']}: DSpark drafter (dspark): Markov rank 16, draft vocabulary 256, confidence head yes, "
        "sample_from_anchor True"
    ]
    g = findings(good["specforge-dspark"])
    assert _ids(g) == set()
    assert g["dspark.family"][0].values == {
        "family": "dspark", "markov_rank": 16, "draft_vocab": 512, "has_confidence_head": True, "sample_from_anchor": True,
    }


def test_d2t_not_i64(good, tmp_path: Path) -> None:
    src = good["spec-dspark"]
    bad = rewrite_gguf(src, tmp_path / "b.gguf", replace={"d2t": _tensor(src, "d2t").astype(np.int32)})
    f = findings(bad)
    assert _ids(f) == {"dspark.d2t_type"}
    assert f["dspark.d2t_type"][0].message == (
        f"{bad}: tensor 'd2t' is I32 but llama.cpp's loader asserts I64 — re-convert with dflash-convert"
    )


def test_d2t_duplicate(good, tmp_path: Path) -> None:
    src = good["spec-dspark"]
    d2t = _tensor(src, "d2t")
    d2t[1] = d2t[0]
    bad = rewrite_gguf(src, tmp_path / "b.gguf", replace={"d2t": d2t})
    f = findings(bad)
    assert _ids(f) == {"dspark.d2t_duplicate"}
    assert f["dspark.d2t_duplicate"][0].message == (
        f"{bad}: tensor 'd2t' maps 1 draft row(s) onto a target id another row already has "
        f"(target id {int(d2t[0])} at rows [0, 1]) — re-convert with dflash-convert"
    )


def test_d2t_offsets_left_unconverted(good, tmp_path: Path) -> None:
    # speculators' stored offsets copied as is (what a converter without the + arange step writes)
    src = good["spec-dspark"]
    absolute = _tensor(src, "d2t")
    offsets = absolute - np.arange(absolute.size)
    assert np.unique(offsets).size < offsets.size  # the seeded fixture has repeated offsets
    bad = rewrite_gguf(src, tmp_path / "b.gguf", replace={"d2t": offsets})
    f = findings(bad)
    assert _ids(f) == {"dspark.d2t_duplicate"}
    assert f["dspark.d2t_duplicate"][0].message.endswith(
        "— it looks like speculators' offsets (target id = d2t[i] + i) stored as is; re-convert with dflash-convert"
    )


def test_d2t_out_of_range(good, tmp_path: Path) -> None:
    src = good["spec-dspark"]
    d2t = _tensor(src, "d2t")
    d2t[-1] = 600
    bad = rewrite_gguf(src, tmp_path / "b.gguf", replace={"d2t": d2t})
    f = findings(bad)
    assert _ids(f) == {"dspark.d2t_range"}
    assert f["dspark.d2t_range"][0].message == (
        f"{bad}: tensor 'd2t' has 1 target id(s) outside the vocabulary (0..511); first: row 255 → 600 — "
        "re-convert with dflash-convert"
    )


def test_d2t_length_differs_from_output_rows(good, tmp_path: Path) -> None:
    src = good["spec-dspark"]
    bad = rewrite_gguf(src, tmp_path / "b.gguf", replace={"d2t": _tensor(src, "d2t")[:-1].copy()})
    f = findings(bad)
    assert "dspark.d2t_length" in _ids(f)
    assert f["dspark.d2t_length"][0].message == (
        f"{bad}: tensor 'd2t' has 255 rows but 'output.weight' has 256 (ne {{64, 256}}); they must agree — "
        "the draft head and its token map come from one checkpoint"
    )


def test_markov_w2_rank_differs(good, tmp_path: Path) -> None:
    src = good["spec-dspark"]
    w2 = _tensor(src, "markov_w2.weight")[:, :8].copy()  # rank 8 against markov_w1's 16
    bad = rewrite_gguf(src, tmp_path / "b.gguf", replace={"markov_w2.weight": w2})
    f = findings(bad)
    assert "dspark.markov_w2_shape" in _ids(f)
    assert f["dspark.markov_w2_shape"][0].message == (
        f"{bad}: tensor 'markov_w2.weight' is ne {{8, 256}} but llama.cpp's loader needs {{rank = 16, n_vocab_draft = 256}}"
    )


def test_markov_w1_rows_not_the_vocabulary(good, tmp_path: Path) -> None:
    src = good["spec-dspark"]
    bad = rewrite_gguf(src, tmp_path / "b.gguf", replace={"markov_w1.weight": _tensor(src, "markov_w1.weight")[:500].copy()})
    f = findings(bad)
    assert "dspark.markov_w1_shape" in _ids(f)
    assert f["dspark.markov_w1_shape"][0].message == (
        f"{bad}: tensor 'markov_w1.weight' is ne {{16, 500}} but llama.cpp's loader needs {{rank, n_vocab = 512}}"
    )


def test_confidence_width(good, tmp_path: Path) -> None:
    src = good["spec-dspark"]
    bad = rewrite_gguf(src, tmp_path / "b.gguf", replace={"conf_proj.weight": _tensor(src, "conf_proj.weight")[:, :64].copy()})
    f = findings(bad)
    assert "dspark.confidence_shape" in _ids(f)
    assert f["dspark.confidence_shape"][0].message == (
        f"{bad}: tensor 'conf_proj.weight' is ne {{64, 1}} but llama.cpp's loader needs {{n_embd + rank = 64 + 16, 1}}"
    )


def test_confidence_flag_false_with_head(good, tmp_path: Path) -> None:
    src = good["spec-dspark"]
    bad = rewrite_gguf(src, tmp_path / "b.gguf", set_keys={"dflash.has_confidence_head": (False, V.BOOL)})
    f = findings(bad)
    assert _ids(f) == {"dspark.confidence_flag"}
    assert f["dspark.confidence_flag"][0].severity.value == "warning"
    assert f["dspark.confidence_flag"][0].message == (
        f"{bad}: 'conf_proj.weight' is present but dflash.has_confidence_head is false — the runtime may skip the "
        "confidence head"
    )


def test_heads_without_dspark_keys(good, tmp_path: Path) -> None:
    src = good["specforge-dspark"]
    bad = rewrite_gguf(src, tmp_path / "b.gguf", drop_keys=("dflash.has_confidence_head", "dflash.sample_from_anchor"))
    f = findings(bad)
    assert "dspark.flags_missing" in _ids(f)
    assert f["dspark.flags_missing"][0].message == (
        f"{bad}: DSpark head tensors (markov_w1.weight, markov_w2.weight, conf_proj.weight) but no "
        "dflash.has_confidence_head / dflash.sample_from_anchor keys — re-convert with dflash-convert"
    )


def test_hf_checkpoint_with_duplicate_d2t(tmp_path_factory: pytest.TempPathFactory) -> None:
    # what conversion (and llama.cpp's converter: "d2t contains duplicate target ids") refuses, said by inspect
    pytest.importorskip("dflash.model")
    root = tmp_path_factory.mktemp("dup")
    _, made = make_zoo.make_zoo(root, ["qwen3-dspark-d2t-dup", "qwen3-dspark"])
    f = findings(made["qwen3-dspark-d2t-dup"])
    assert _ids(f) == {"dspark.checkpoint"}
    assert f["dspark.checkpoint"][0].message == (
        f"{made['qwen3-dspark-d2t-dup']}: d2t contains duplicate target ids (target id 1 at rows [0, 1])"
    )
    assert _ids(findings(made["qwen3-dspark"])) == set()
