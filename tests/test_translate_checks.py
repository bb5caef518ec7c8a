"""Translation (GGUF → GGUF) runs the spec, tensor-set and target checks a conversion runs (issue 16
item 5): a drafter GGUF whose metadata a config could never produce is refused with a one-line error
naming the file, exit 1, and no output. The broken GGUFs are written with gguf-py's own GGUFWriter
from a good conversion, with one value changed."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from dflashkit.cli import convert_command
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError

QUIET = dict(progress=False, warn=lambda m: None)


@pytest.fixture(scope="module")
def source(drafters, targets, tmp_path_factory) -> Path:
    """A good llama.cpp-dialect drafter GGUF with the target's tokenizer (512 tokens)."""
    out = tmp_path_factory.mktemp("translate") / "good.gguf"
    convert(drafters["qwen3-b16"], out, outtype="f32", target=targets[64]["gguf"], **QUIET)
    return out


def rewrite(src: Path, out: Path, *, changes: dict | None = None, drop: str | None = None) -> Path:
    """Copy ``src`` with gguf-py, replacing the values of ``changes`` (same GGUF types) and dropping tensor ``drop``."""
    changes = changes or {}
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out, str(r.fields["general.architecture"].contents()))
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        sub = f.types[1] if len(f.types) > 1 else None
        w.add_key_value(k, changes.get(k, f.contents()), f.types[0], sub)
    for t in r.tensors:
        if t.name != drop:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return out


def refused(src: Path, out: Path, message: str, **kw) -> None:
    with pytest.raises(DFlashError) as info:
        convert(src, out, **QUIET, **kw)
    assert str(info.value) == f"{src}: {message}"
    assert not out.exists()


def test_good_source_translates(source: Path, tmp_path: Path) -> None:
    # the helper itself leaves a translatable file: each refusal below is caused by its one change
    convert(rewrite(source, tmp_path / "same.gguf"), tmp_path / "o.gguf", dialect="luce", **QUIET)
    assert (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        # llama.cpp stores HF id + 1: stored 0 is HF id -1
        ([0, 5], "target layer ids have a negative id: [-1, 4]"),
        ([5, 2], "target layer ids must be sorted and unique, got [4, 1]"),
        ([3, 3], "target layer ids must be sorted and unique, got [2, 2]"),
    ],
)
def test_bad_tap_ids_are_refused(source: Path, tmp_path: Path, stored: list[int], message: str) -> None:
    bad = rewrite(source, tmp_path / "bad.gguf", changes={"dflash.target_layers": stored})
    refused(bad, tmp_path / "o.gguf", message, dialect="luce")


@pytest.mark.parametrize(
    ("key", "field"),
    [("dflash.block_size", "block_size"), ("dflash.attention.head_count", "n_heads"), ("dflash.block_count", "n_layers")],
)
def test_zero_sizes_are_refused(source: Path, tmp_path: Path, key: str, field: str) -> None:
    bad = rewrite(source, tmp_path / "bad.gguf", changes={key: 0})
    refused(bad, tmp_path / "o.gguf", f"{field} must be >= 1, got 0", dialect="luce")


def test_mask_outside_own_vocabulary_is_refused(source: Path, tmp_path: Path) -> None:
    bad = rewrite(source, tmp_path / "bad.gguf", changes={"tokenizer.ggml.mask_token_id": 512})
    refused(bad, tmp_path / "o.gguf", "mask token id 512 is outside the vocabulary (512 tokens)", dialect="luce")


def test_mask_outside_target_vocabulary_names_the_target(source: Path, targets, tmp_path: Path) -> None:
    # with --target the target rule speaks first, exactly as in a conversion
    bad = rewrite(source, tmp_path / "bad.gguf", changes={"tokenizer.ggml.mask_token_id": 600})
    target = targets[64]["gguf"]
    with pytest.raises(DFlashError) as info:
        convert(bad, tmp_path / "o.gguf", target=target, **QUIET)
    assert str(info.value) == f"{target}: drafter mask_token_id 600 is outside the target vocabulary (512 tokens)"


def test_missing_tensor_is_refused(source: Path, tmp_path: Path) -> None:
    bad = rewrite(source, tmp_path / "bad.gguf", drop="blk.0.ffn_up.weight")
    refused(bad, tmp_path / "o.gguf", "missing tensor(s) for this config: blk.0.ffn_up.weight", dialect="llama.cpp")


def test_cli_exit_code_and_one_line(source: Path, tmp_path: Path) -> None:
    bad = rewrite(source, tmp_path / "bad.gguf", changes={"dflash.block_size": 0})
    result = CliRunner().invoke(convert_command, [str(bad), str(tmp_path / "o.gguf"), "--dialect", "luce", "-q"])
    assert result.exit_code == 1
    assert result.output == f"error: {bad}: block_size must be >= 1, got 0\n"
    assert not (tmp_path / "o.gguf").exists()
