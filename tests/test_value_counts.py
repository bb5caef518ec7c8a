"""Numbers that would change silently: NaN / inf weights and values an F16 file cannot hold are counted per tensor by
dflash-convert and dflash-quantize; dflash-convert names them in warnings and refuses them under --strict (exit 1,
nothing written); dflash-quantize refuses them as llama-quantize does, and writes them with warnings under
--allow-nonfinite."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dflashkit.cli import convert_command, quantize_command
from dflashkit.codecs.values import ValueCounts
from dflashkit.errors import DFlashError

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
DOWN, UP = "layers.1.mlp.down_proj.weight", "layers.0.mlp.up_proj.weight"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_counts_agree_with_numpys_f16_cast() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 65504, 65519.99, 65520, -70000, 1e30, 1.0], np.float32)
    counts = ValueCounts("src")
    counts.add("t", x, to_f16=True)
    with np.errstate(over="ignore"):
        became_inf = int(np.count_nonzero(np.isinf(x.astype(np.float16)) & np.isfinite(x)))
    assert counts.nonfinite == {"t": 3} and counts.f16_overflow == {"t": became_inf} == {"t": 3}
    with pytest.raises(DFlashError, match="src: tensor 't' has 3 NaN or infinite value"):
        ValueCounts("src", strict=True).add("t", x)
    # the same values in bf16 (65504 and 65519.99 round up to 65536 there, past F16) through the bf16 → f16 path
    bits = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    widened = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    with np.errstate(over="ignore"):
        half = widened.astype(np.float16)
    fast = ValueCounts("src")
    fast.add_bf16_to_f16("t", bits)
    assert fast.nonfinite == {"t": 3}
    assert fast.f16_overflow == {"t": int(np.count_nonzero(np.isinf(half) & np.isfinite(widened)))} == {"t": 5}


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained drafter with one NaN and one inf in DOWN, and three values of 1e6 in UP."""
    d = tmp_path_factory.mktemp("poisoned") / "drafter"
    shutil.copytree(TRAINED / "drafter", d)
    tensors = load_file(str(d / "model.safetensors"))
    down, up = tensors[DOWN].clone(), tensors[UP].clone()
    down[0, 0], down[1, 1] = float("nan"), float("inf")
    up[0, :3] = 1e6
    tensors.update({DOWN: down, UP: up})
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def _warnings(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("warning: layers.") or ln.startswith("warning: blk.")]


@pytest.mark.parametrize("fast", [False, True], ids=["numpy", "bf16-kernel"])
def test_convert_to_f16_names_them(poisoned: Path, tmp_path: Path, fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from dflashkit.converters import convert as convert_module

    if fast:  # the one-pass bf16 → f16 kernel counts the same values
        monkeypatch.setattr(convert_module, "FAST_F16_MIN_VALUES", 0)
    out = tmp_path / "d.gguf"
    args = [str(poisoned), str(out), "--outtype", "f16", "--target", str(TRAINED / "target")]
    r = CliRunner().invoke(convert_command, args)
    assert r.exit_code == 0 and out.is_file(), r.output
    assert _warnings(r.output) == [
        f"warning: {DOWN}: 2 NaN or infinite value(s), written as they are (a runtime computes NaN from them)",
        f"warning: {UP}: 3 value(s) beyond ±65504 became ±inf in F16 (use bf16 or f32 for this tensor)",
    ]
    assert "RuntimeWarning" not in r.output
    out.unlink()
    r = CliRunner().invoke(convert_command, [*args, "--strict"])
    assert r.exit_code == 1 and not out.exists()
    assert r.output.strip().splitlines()[-1].startswith(f"error: {poisoned}: tensor '")


def test_quantize_refuses_them_and_allow_nonfinite_names_them(poisoned: Path, tmp_path: Path) -> None:
    src = tmp_path / "bf16.gguf"  # bf16 → bf16: a kernel copy of the bytes, scanned beside it (bf16 holds 1e6)
    args = [str(poisoned), str(src), "--outtype", "bf16", "--target", str(TRAINED / "target")]
    r = CliRunner().invoke(convert_command, [*args, "--strict"])
    assert r.exit_code == 1 and not src.exists() and list(tmp_path.iterdir()) == [], r.output
    assert r.output.strip().splitlines()[-1] == (f"error: {poisoned}: tensor '{DOWN}' has 2 NaN or infinite value(s)"
                                                 " — refusing under --strict (without it: written, with a warning)")
    r = CliRunner().invoke(convert_command, args)
    assert r.exit_code == 0 and _warnings(r.output) == [
        f"warning: {DOWN}: 2 NaN or infinite value(s), written as they are (a runtime computes NaN from them)"], r.output
    out = tmp_path / "q.gguf"
    refusal = (f"error: {src}: tensor 'blk.1.ffn_down.weight' has 2 NaN or infinite value(s) — llama-quantize refuses "
               'it too ("has invalid data"): fix the source, or pass --allow-nonfinite to write it with a warning')
    for strict in ([], ["--strict"]):  # refusing is the default; --strict is accepted
        r = CliRunner().invoke(quantize_command, [str(src), str(out), "Q8_0", *strict])
        assert r.exit_code == 1 and not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bf16.gguf"]
        assert r.output.strip() == refusal
    r = CliRunner().invoke(quantize_command, [str(src), str(out), "Q8_0", "--allow-nonfinite"])
    assert r.exit_code == 0 and out.is_file(), r.output
    assert _warnings(r.output) == [
        "warning: blk.1.ffn_down.weight: 2 NaN or infinite value(s), written as they are (a runtime computes NaN "
        "from them)"]
    # BF16 → BF16 copies every tensor in the kernel: the scan beside the copy finds the same two
    out.unlink()
    r = CliRunner().invoke(quantize_command, [str(src), str(out), "BF16", "--allow-nonfinite"])
    assert r.exit_code == 0 and out.is_file(), r.output
    assert _warnings(r.output) == [
        "warning: blk.1.ffn_down.weight: 2 NaN or infinite value(s), written as they are (a runtime computes NaN "
        "from them)"]
    r = CliRunner().invoke(quantize_command, [str(src), str(out), "BF16", "--force"])
    assert r.exit_code == 1 and out.is_file(), r.output  # the old OUT is kept: a failed --force run changes nothing
    assert r.output.strip().splitlines()[-1] == refusal


def test_inspect_names_non_finite_weights(poisoned: Path, tmp_path: Path) -> None:
    from dflashkit.cli import inspect_command
    import json

    gguf_file = tmp_path / "bf16.gguf"
    assert CliRunner().invoke(convert_command, [str(poisoned), str(gguf_file), "--outtype", "bf16", "--target",
                                                str(TRAINED / "target"), "-q"]).exit_code == 0
    r = CliRunner().invoke(inspect_command, [str(poisoned), str(gguf_file), str(TRAINED / "drafter"), "--format",
                                             "json"])
    assert r.exit_code == 1
    files = json.loads(r.stdout)["files"]
    found = [[f for f in file["findings"] if f["id"] == "tensor.nonfinite"] for file in files]
    assert [f["values"] for f, in found[:2]] == [{"tensors": {DOWN: 2}}, {"tensors": {"blk.1.ffn_down.weight": 2}}]
    assert found[1][0]["message"] == (f"{gguf_file}: 2 NaN or infinite weight value(s) in 1 tensor(s): "
                                      "blk.1.ffn_down.weight (2) — every draft through them is NaN; re-convert from "
                                      "a good checkpoint")
    assert found[2] == []  # the trained drafter itself is clean


def _blocks_with_planted_scales(type_name: str, blocks: int, rng: np.random.Generator) -> tuple[bytes, list[int]]:
    """``blocks`` random blocks of ``type_name`` whose float scales are finite, except: for each scale field, one
    block with NaN, one with +inf, one with −inf there; and one block with every scale NaN. Returns the bytes and
    the planted blocks."""
    from dflashkit.codecs.values import _BLOCK_SCALES
    from dflashkit.quant_types import sizes
    from gguf import GGMLQuantizationType

    _, unit = sizes(GGMLQuantizationType[type_name])
    data = rng.integers(0, 256, size=(blocks, unit), dtype=np.uint8)
    fields = _BLOCK_SCALES[type_name]
    for start, kind in fields:
        assert kind == "F16"
        data[:, start : start + 2] = rng.uniform(-2, 2, blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    planted = []
    specials = np.array([np.nan, np.inf, -np.inf], np.float16).view(np.uint8).reshape(-1, 2)
    for f, (start, _) in enumerate(fields):
        for s, bits in enumerate(specials):
            b = 1 + 3 * f + s
            data[b, start : start + 2] = bits
            planted.append(b)
    last = blocks - 1
    for start, _ in fields:
        data[last, start : start + 2] = specials[0]
    planted.append(last)
    return data.tobytes(), planted


@pytest.mark.parametrize("type_name", sorted(__import__("dflashkit.codecs.values", fromlist=["x"])._BLOCK_SCALES))
def test_block_scales_agree_with_gguf_py_dequantize(type_name: str, tmp_path: Path) -> None:
    # the scale offsets are ours (ggml-common.h's structs): gguf-py's dequantizer is the judge of what is non-finite
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from dflashkit.codecs.values import nonfinite_count
    from dflashkit.quant_types import sizes

    qtype = GGMLQuantizationType[type_name]
    values, unit = sizes(qtype)
    raw, planted = _blocks_with_planted_scales(type_name, 12, np.random.default_rng(7))
    with np.errstate(all="ignore"):
        deq = dequantize(np.frombuffer(raw, np.uint8).reshape(3, -1), qtype)
    expected = int(deq.size - np.count_nonzero(np.isfinite(deq)))
    path = tmp_path / "t.bin"
    path.write_bytes(b"\0" * 5 + raw)
    assert expected == len(planted) * values  # every value of a planted block, none elsewhere
    for buffer_bytes in (unit, 3 * unit + 1, len(raw)):  # block-aligned reads whatever the buffer
        assert nonfinite_count(path, 5, len(raw), type_name, bytearray(buffer_bytes)) == expected


def test_inspect_names_a_nan_scale_in_a_quantized_tensor(tmp_path: Path) -> None:
    from gguf import GGUFReader
    import json

    from dflashkit.cli import inspect_command

    f16, q8 = tmp_path / "f16.gguf", tmp_path / "q8.gguf"
    assert CliRunner().invoke(convert_command, [str(TRAINED / "drafter"), str(f16), "--outtype", "f16", "--target",
                                                str(TRAINED / "target"), "-q"]).exit_code == 0
    assert CliRunner().invoke(quantize_command, [str(f16), str(q8), "Q8_0", "-q"]).exit_code == 0
    clean = CliRunner().invoke(inspect_command, [str(q8), "--format", "json"])
    assert [f for f in json.loads(clean.stdout)["files"][0]["findings"] if f["id"] == "tensor.nonfinite"] == []
    t = next(t for t in GGUFReader(q8).tensors if t.name == "blk.1.ffn_down.weight")
    assert t.tensor_type.name == "Q8_0"
    data = bytearray(q8.read_bytes())
    block = 34 * 5  # the sixth block's d (f16 at its start) becomes NaN
    data[t.data_offset + block : t.data_offset + block + 2] = np.array([np.nan], np.float16).tobytes()
    q8.write_bytes(bytes(data))
    r = CliRunner().invoke(inspect_command, [str(q8), "--format", "json"])
    assert r.exit_code == 1
    found = [f for f in json.loads(r.stdout)["files"][0]["findings"] if f["id"] == "tensor.nonfinite"]
    assert found == [{**found[0], "values": {"tensors": {"blk.1.ffn_down.weight": 32}}}]
    assert found[0]["message"].startswith(f"{q8}: 32 NaN or infinite weight value(s) in 1 tensor(s): "
                                          "blk.1.ffn_down.weight (32)")


def test_translate_counts_what_it_copies(poisoned: Path, tmp_path: Path) -> None:
    # a translation copies the stored bytes: the NaN / inf stay, so they are named, and --strict refuses them
    src = tmp_path / "bf16.gguf"
    assert CliRunner().invoke(convert_command, [str(poisoned), str(src), "--outtype", "bf16", "--target",
                                                str(TRAINED / "target"), "-q"]).exit_code == 0
    out = tmp_path / "luce.gguf"
    r = CliRunner().invoke(convert_command, [str(src), str(out), "--dialect", "luce", "--strict"])
    assert r.exit_code == 1 and not out.exists(), r.output
    assert r.output.strip().splitlines()[-1] == (f"error: {src}: tensor 'blk.1.ffn_down.weight' has 2 NaN or "
                                                 "infinite value(s) — refusing under --strict (without it: written, "
                                                 "with a warning)")
    r = CliRunner().invoke(convert_command, [str(src), str(out), "--dialect", "luce"])
    assert r.exit_code == 0 and out.is_file(), r.output
    assert _warnings(r.output) == [
        "warning: blk.1.ffn_down.weight: 2 NaN or infinite value(s), written as they are (a runtime computes NaN "
        "from them)"]


@pytest.mark.parametrize("type_name, dtype", [("F32", np.float32), ("F16", np.float16), ("F64", np.float64),
                                              ("BF16", None)])
def test_stored_bit_counts_agree_with_numpys_isfinite(type_name: str, dtype, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the stored-bit count (a window's magnitude max, then an exact count) against np.isfinite, with buffers that
    # split the values across reads and windows that hold none, one or many of them
    from dflashkit.codecs.values import nonfinite_count

    rng = np.random.default_rng(11)
    x = rng.standard_normal(50_001).astype(np.float32) * 1e3
    x[rng.choice(x.size, 700, replace=False)] = rng.choice([np.nan, -np.nan, np.inf, -np.inf], 700)
    if dtype is None:  # bfloat16: the top half of each float32 (NaN and ±inf keep their exponent)
        raw, finite = (x.view(np.uint32) >> 16).astype(np.uint16).tobytes(), np.isfinite(x)
    else:
        with np.errstate(over="ignore"):
            stored = x.astype(dtype)
        raw, finite = stored.tobytes(), np.isfinite(stored)
    expected = int(x.size - np.count_nonzero(finite))
    assert expected >= 700
    path = tmp_path / "t.bin"
    path.write_bytes(b"\0" * 3 + raw)
    for buffer_bytes in (8, 4096, 3 << 20):
        assert nonfinite_count(path, 3, len(raw), type_name, bytearray(buffer_bytes)) == expected
    monkeypatch.setattr("dflashkit.codecs.values.SCAN_BYTES", 256)  # windows of 32-128 values: clean ones too
    assert nonfinite_count(path, 3, len(raw), type_name, bytearray(4096)) == expected
