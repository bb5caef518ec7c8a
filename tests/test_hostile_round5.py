"""Issue 47, hostile round 5: importance matrices in, ``dflash-imatrix`` out, the new types under ``--strict``. Each
class plants its own cases and runs the command as a user does: llama-quantize's bytes (both pinned builds, run
here) where llama-quantize succeeds, else one ``error:`` line and its exit code — inputs byte-identical, nothing
written, under the memory cap and, where a loop or an allocation was the defect, within a time bound."""

from __future__ import annotations

import os
import struct
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

import hostile
import make_drafters
from contained import check_contained, run_contained
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError
from dflashkit.io.gguf_reader import open_gguf
from imatrix_files import (entry_arrays, kv_string, kv_strings, kv_u32, kv_u64, legacy_bytes, standard_kvs,
                           weight_tensors, write_raw_imatrix)

pytestmark = pytest.mark.slow  # every case runs a command as a child, most beside llama-quantize of both builds

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
BUILDS = [("0.3.36", "DFLASHKIT_LLAMA_CPP_BIN"), ("b11549", "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN")]
QUIET = dict(progress=False, warn=lambda m: None)
WIDE = dict(hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=2,
            dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 5]})


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A drafter at K-quant width (256-wide rows) and a narrow one (64: every K-quant tensor falls back)."""
    folder = tmp_path_factory.mktemp("round5")
    out = {}
    for name, config in (("wide", WIDE), ("narrow", {})):
        src = make_drafters.make_drafter(folder / f"src-{name}", "qwen3-b16", config_overrides=config)
        out[name] = folder / f"{name}.gguf"
        convert(src, out[name], outtype="bf16", **QUIET)
    return out


def _llama_quantize_builds() -> list[tuple[str, Path]]:
    out = []
    for build, var in BUILDS:
        binary = Path(os.environ.get(var) or "/nonexistent") / "llama-quantize"
        if binary.is_file():
            out.append((build, binary))
    return out


def _same_bytes_as_llama_quantize(folder: Path, args: list[str]) -> Path:
    """Run ``dflash-quantize ARGS`` and every pinned build's ``llama-quantize ARGS`` in ``folder`` (relative paths
    as given, so the recorded ``quantize.imatrix.file`` is the same string); assert every output is the same
    bytes. ``args``: options, then IN OUT-NAME TYPE (OUT-NAME gets a prefix per tool)."""
    builds = _llama_quantize_builds()
    if not builds:
        pytest.skip("set DFLASHKIT_LLAMA_CPP_BIN / DFLASHKIT_LLAMA_CPP_MAINLINE_BIN (.ci/run builds both): the "
                    "claim is llama-quantize's bytes")
    *opts, src, name, qtype = args
    ours = folder / f"ours-{name}"
    run = hostile.run_capped([*hostile.cli("quantize_command"), *opts, src, ours.name, qtype, "-q"], cwd=str(folder))
    assert run.returncode == 0, run.describe()
    assert "Traceback" not in run.stderr and "Warning" not in run.stderr, run.stderr  # no raw Python warning
    assert run.peak_rss < hostile.CAP_BYTES, run.describe()
    for build, binary in builds:
        theirs = folder / f"llama-{build}-{name}"
        proc = subprocess.run([str(binary), *opts, src, theirs.name, qtype], cwd=folder, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, (build, proc.stderr[-2000:])
        assert theirs.read_bytes() == ours.read_bytes(), f"{build}: not llama-quantize's bytes for {args}"
    return ours


def _entries(model: Path) -> list[tuple[str, int]]:
    return weight_tensors(model)


def _refused(tmp: Path, args: list, message: str, code: int = 1, inputs: list[Path] = ()) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    run = run_contained("quantize_command", [*args, "-q"], inputs=list(inputs), tmp=tmp / "run")
    check_contained(run, code, message, bounded=True)
    assert not Path(args[1]).exists(), "an output was written"


# ---- internal errors: a count of the wrong type is one line, never "internal error" -------------------------------

@pytest.mark.parametrize("case, message", [
    ("chunk_count UINT64 above 2^32", "imatrix.chunk_count is a UINT64, not a UINT32 — llama-quantize aborts on it"),
    ("chunk_size a string", "imatrix.chunk_size is a STRING, not a UINT32 — llama-quantize aborts on it"),
])
def test_a_count_of_another_type_is_refused(models: dict[str, Path], tmp_path: Path, case: str,
                                            message: str) -> None:
    kvs = [kv_string("general.type", b"imatrix"), kv_strings("imatrix.datasets", [b"d.txt"])]
    kvs += ([kv_u64("imatrix.chunk_count", 5 * 2**32), kv_u32("imatrix.chunk_size", 512)] if "UINT64" in case else
            [kv_u32("imatrix.chunk_count", 5), kv_string("imatrix.chunk_size", b"512")])
    im = write_raw_imatrix(tmp_path / "m.gguf", kvs, entry_arrays(_entries(models["wide"])))
    _refused(tmp_path, [models["wide"], tmp_path / "q.gguf", "q4_0", "--imatrix", im], message,
             inputs=[models["wide"], im])
    for build, binary in _llama_quantize_builds():  # llama-quantize does not produce a file from it either
        proc = subprocess.run([str(binary), "--imatrix", str(im), str(models["wide"]), str(tmp_path / build), "q4_0"],
                              capture_output=True, timeout=300)
        assert proc.returncode != 0 and not (tmp_path / build).exists(), build


# ---- llama-quantize's bytes where it succeeds -------------------------------------------------------------------

def _plant(case: str, folder: Path, model: Path) -> tuple[list[str], str]:
    """The case's files in ``folder``; (dflash-quantize / llama-quantize arguments, what the file must record)."""
    entries = _entries(model)
    if case == "counts of 1e20":  # lround overflows: weight 1 for that entry
        arrays = entry_arrays(entries)
        arrays[1] = (arrays[1][0], np.array([1e20], np.float32))
        write_raw_imatrix(folder / "m.gguf", standard_kvs(), arrays)
        return ["--imatrix", "m.gguf", model.name, "out.gguf", "iq4_xs"], ""
    if case == "a dataset name with a NUL byte":
        write_raw_imatrix(folder / "m.gguf", standard_kvs(dataset=b"abc\0defg"), entry_arrays(entries))
        return ["--imatrix", "m.gguf", model.name, "out.gguf", "q4_0"], "abc"
    if case == "a dataset name whose 127th byte splits a character":
        write_raw_imatrix(folder / "m.gguf", standard_kvs(dataset=b"a" * 126 + "é".encode() + b"tail"),
                          entry_arrays(entries))
        return ["--imatrix", "m.gguf", model.name, "out.gguf", "q4_0"], ""
    if case == "a legacy dataset name of 5,000 bytes":
        data = legacy_bytes(entries) + struct.pack("<ii", 3, 5000) + b"x" * 5000
        (folder / "m.dat").write_bytes(data)
        return ["--imatrix", "m.dat", model.name, "out.gguf", "q4_0"], "x" * 127
    if case == "a legacy file with two trailing bytes":
        (folder / "m.dat").write_bytes(legacy_bytes(entries) + b"\x07\x01")
        return ["--imatrix", "m.dat", model.name, "out.gguf", "q4_0"], ""
    if case == "a legacy file with a 2.6 GB sparse zero tail":
        path = folder / "m.dat"
        path.write_bytes(legacy_bytes(entries))
        with open(path, "r+b") as f:
            f.truncate(len(legacy_bytes(entries)) + int(2.6e9))
        return ["--imatrix", "m.dat", model.name, "out.gguf", "q4_0"], ""
    if case == "an imatrix path whose 127th byte splits a character":
        sub = folder / ("d" * 99)  # 100 bytes with the '/': the 14th 'é' starts at byte 127
        sub.mkdir()
        name = "é" * 14 + ".gguf"
        write_raw_imatrix(sub / name, standard_kvs(), entry_arrays(entries))
        return ["--imatrix", f"{sub.name}/{name}", model.name, "out.gguf", "q4_0"], ""
    if case == "--tensor-type with a POSIX class":
        return ["--tensor-type", r"blk\.[[:digit:]]\.attn_v=q8_0", model.name, "out.gguf", "q4_k_m"], ""
    if case == "Q2_K_S without an imatrix where every tensor falls back":
        return [model.name, "out.gguf", "q2_k_s"], ""
    raise AssertionError(case)


@pytest.mark.parametrize("case", [
    "counts of 1e20", "a dataset name with a NUL byte", "a dataset name whose 127th byte splits a character",
    "a legacy dataset name of 5,000 bytes", "a legacy file with two trailing bytes",
    "a legacy file with a 2.6 GB sparse zero tail", "an imatrix path whose 127th byte splits a character",
    "--tensor-type with a POSIX class", "Q2_K_S without an imatrix where every tensor falls back",
])
def test_llama_quantizes_bytes(models: dict[str, Path], tmp_path: Path, case: str) -> None:
    model = models["narrow" if "falls back" in case else "wide"]
    (tmp_path / model.name).symlink_to(model)
    args, dataset = _plant(case, tmp_path, model)
    before = {p.name: p.stat().st_size for p in tmp_path.iterdir() if p.is_file()}
    out = _same_bytes_as_llama_quantize(tmp_path, args)
    if "splits a character" in case:  # the recorded string ends in half a character, as llama-quantize's does
        assert b"\xc3\x00" not in out.read_bytes()[:4096] and (b"a" * 126 + b"\xc3" in out.read_bytes()
                                                                 or "path" in case)
        return
    with open_gguf(out) as g:
        if dataset:
            assert g.get("quantize.imatrix.dataset") == dataset
        if case == "--tensor-type with a POSIX class":
            assert g.tensors["blk.0.attn_v.weight"].ggml_type.name == "Q8_0"
            assert g.tensors["blk.0.attn_q.weight"].ggml_type.name != "Q8_0"
        if case == "a legacy file with two trailing bytes":
            assert g.get("quantize.imatrix.chunks_count") == 0x0107  # the two bytes, zero-padded
        if case == "counts of 1e20":
            assert g.get("quantize.imatrix.entries_count") == len(_entries(model))
    assert {p.name: p.stat().st_size for p in tmp_path.iterdir() if p.is_file() and p.name in before} == before


def test_the_sparse_tail_is_never_read(models: dict[str, Path], tmp_path: Path) -> None:
    """The 2.6 GB tail of a legacy file: a bounded run, well under the memory cap (llama-quantize reads 11 MB)."""
    work = tmp_path / "w"
    work.mkdir()
    args, _ = _plant("a legacy file with a 2.6 GB sparse zero tail", work, models["wide"])
    run = run_contained("quantize_command", [models["wide"], work / "q.gguf", "q4_0", "--imatrix", work / "m.dat", "-q"],
                        inputs=[models["wide"]], tmp=tmp_path / "run")
    check_contained(run, 0, bounded=True)
    assert run.peak_rss < 512 * 2**20, f"{run.peak_rss / 2**20:.0f} MiB"


# ---- refused where llama-quantize aborts, or where its result would be wrong without a word ------------------------

def test_refusals_name_the_file_and_why(models: dict[str, Path], tmp_path: Path) -> None:
    model = models["wide"]
    entries = _entries(model)
    cases = {
        "no final padding": (write_raw_imatrix(tmp_path / "a.gguf", standard_kvs(), entry_arrays(entries) +
                                               [("zz.extra", np.array([3.0, 4.0, 5.0], np.float32))],
                                               pad_last=False),
                             "short of its last tensor's padding — ggml refuses the file"),
        "an entry with an empty name": (write_raw_imatrix(tmp_path / "b.gguf", standard_kvs(), entry_arrays(entries)
                                                          + entry_arrays([("", 256)])),
                                        "an entry with an empty name"),
        "no entry at all": (write_raw_imatrix(tmp_path / "c.gguf", standard_kvs(),
                                              [("token_embd.weight.sums", np.ones(8, np.float32))]),
                            "holds no importance-matrix entry"),
    }
    for case, (im, message) in cases.items():
        _refused(tmp_path / case.replace(" ", "-"), [model, tmp_path / "q.gguf", "q4_0", "--imatrix", im], message,
                 inputs=[model, im])
    im = write_raw_imatrix(tmp_path / "d.gguf", standard_kvs(), entry_arrays(entries))
    _refused(tmp_path / "none-left", [model, tmp_path / "q.gguf", "iq4_xs", "--imatrix", im, "--include-weights",
                                      "no-such-tensor"], "--include-weights / --exclude-weights left no entry",
             inputs=[model, im])
    _refused(tmp_path / "lookbehind", [model, tmp_path / "q.gguf", "q4_k_m", "--tensor-type", "(?<!x)attn_v=q8_0"],
             "not ECMAScript", code=2, inputs=[model])


def test_an_imatrix_claiming_4e8_values_is_refused_bounded(models: dict[str, Path], tmp_path: Path) -> None:
    """A 1.6 GB sparse entry (4 KB on disk): refused from its header, never read (it reached 6.1 GB)."""
    model = models["wide"]
    entries = _entries(model)
    for name, message in ((entries[0][0], f"{entries[0][0]}: 400000000 weights for a tensor of {entries[0][1]} columns"),
                          ("blk.9.attn_q.weight", "a tensor this file does not have")):
        arrays = [a for a in entry_arrays(entries) if not a[0].startswith(f"{name}.")]
        arrays += [(f"{name}.in_sum2", 400_000_000), (f"{name}.counts", np.array([1.0], np.float32))]
        im = write_raw_imatrix(tmp_path / "big.gguf", standard_kvs(), arrays)
        assert im.stat().st_blocks * 512 < 64 << 20  # sparse
        run = run_contained("quantize_command", [model, tmp_path / "q.gguf", "q4_0", "--imatrix", im, "-q"],
                            inputs=[model], tmp=tmp_path / f"run-{name}")
        check_contained(run, 1, message, bounded=True)
        assert run.peak_rss < 1 << 30, f"{run.peak_rss / 2**20:.0f} MiB"


def test_a_scale_that_overflows_is_refused(tmp_path: Path) -> None:
    import gguf

    src = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(src), arch="llama")
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_q.weight", (np.random.default_rng(0).standard_normal((8, 256)) * 1e6).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for strict in ([], ["--strict"]):  # as llama-quantize ("quantized data validation failed"); --strict: the same
        _refused(tmp_path / f"run{len(strict)}", [src, tmp_path / "q.gguf", "q4_0", *strict],
                 "tensor 'blk.0.attn_q.weight': 64 Q4_0 block(s) whose scale overflows F16", inputs=[src])
    run = run_contained("quantize_command", [src, tmp_path / "q.gguf", "q4_0", "--allow-nonfinite"], inputs=[src],
                        tmp=tmp_path / "warn")
    assert run.returncode == 0 and "64 quantized block(s) whose scale overflowed F16" in run.stderr, run.stderr


# ---- dflash-imatrix: bounded and careful ------------------------------------------------------------------------

def test_dflash_imatrix_refuses_past_the_targets_context_at_once(tmp_path: Path) -> None:
    run = run_contained("imatrix_command", [TRAINED / "drafter", "--target", TRAINED / "target", "--max-prompts", "1",
                                            "--max-new-tokens", "5000", "-o", tmp_path / "m.gguf", "-q"],
                        inputs=[TRAINED], tmp=tmp_path / "run")
    check_contained(run, 1, "new tokens exceed the target's context of 4096", bounded=True)
    assert run.elapsed_s < 60 and not (tmp_path / "m.gguf").exists()


def test_dflash_imatrix_never_writes_into_an_input_folder(tmp_path: Path) -> None:
    import shutil

    drafter = tmp_path / "drafter"
    shutil.copytree(TRAINED / "drafter", drafter)
    (drafter / "sub").mkdir()
    (tmp_path / "link").symlink_to(drafter / "sub", target_is_directory=True)
    for out in (drafter / "x.gguf", tmp_path / "link" / "y.gguf"):  # directly, and through a link
        run = run_contained("imatrix_command", [drafter, "--target", TRAINED / "target", "-o", out, "-q"],
                            inputs=[drafter, TRAINED / "target"], tmp=tmp_path / f"run-{out.name}")
        check_contained(run, 2, "is inside the input", bounded=True)
        assert not out.exists()


def test_dflash_imatrix_refuses_sums_that_overflow_float32(tmp_path: Path) -> None:
    from dflashkit.imatrix_collect import ImatrixResult, write_imatrix

    result = ImatrixResult({"blk.0.attn_q.weight": np.full(8, 1e300), "blk.0.attn_k.weight": np.ones(8)},
                           {"blk.0.attn_q.weight": 4, "blk.0.attn_k.weight": 4}, 3, 16, 1, "p.jsonl", "drafter")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no raw numpy warning on the way
        with pytest.raises(DFlashError, match=r"drafter: the sums of squares of blk\.0\.attn_q\.weight's inputs "
                                              r"overflow float32"):
            write_imatrix(result, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


# ---- the second attacker pass (a different reader than the one who wrote the fixes): each finding planted again ----

def _with_huge_array(out: Path, entries: list[tuple[str, int]], n: int) -> Path:
    """An imatrix whose last key is a UINT64 array of ``n`` values left as a sparse hole."""
    from imatrix_files import _s

    tensors = entry_arrays(entries)
    kvs = standard_kvs()
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs) + 1) + b"".join(kvs)
    head += _s(b"zz.huge") + struct.pack("<IIQ", 9, 10, n)
    with open(out, "wb") as f:
        f.write(head)
        f.seek(len(head) + 8 * n)
        offset, infos = 0, b""
        for name, data in tensors:
            infos += _s(name.encode()) + struct.pack("<IQIQ", 1, data.size, 0, offset)
            offset += -(-4 * data.size // 32) * 32
        f.write(infos)
        f.write(b"\0" * (-f.tell() % 32))
        for _, data in tensors:
            f.write(data.astype("<f4").tobytes())
            f.write(b"\0" * (-f.tell() % 32))
    return out


def test_second_pass_imatrix_files(models: dict[str, Path], tmp_path: Path) -> None:
    model = models["wide"]
    entries = _entries(model)
    arrays = entry_arrays(entries)
    many = [(f"t{i}.in_sum2", np.zeros(0, np.float32)) for i in range(300_000)]
    cases = {  # a NUL cuts a name in ggml: it would stand for another key or tensor
        "NUL in a tensor name": (arrays + [(f"{entries[1][0]}.in_sum2\0zz", np.ones(entries[1][1], np.float32))],
                                 standard_kvs(), "a tensor name holding a NUL byte"),
        "NUL in a key": (arrays, [kv_u32("imatrix.chunk_count\0x", 77), *standard_kvs()], "a key holding a NUL byte"),
        ".in_sum of another length": (arrays + [(f"{entries[0][0]}.in_sum", np.ones(3, np.float32))], standard_kvs(),
                                      "llama.cpp b11549 refuses it"),
        "n_layer_nextn a string": (arrays, [*standard_kvs(), kv_string("imatrix.n_layer_nextn", b"x")],
                                   "imatrix.n_layer_nextn is a STRING"),
        "300,000 tensor headers": (many, standard_kvs(), "over the cap of 262144"),
    }
    for case, (tensors, kvs, message) in cases.items():
        im = write_raw_imatrix(tmp_path / f"{len(list(tmp_path.iterdir()))}.gguf", kvs, tensors)
        _refused(tmp_path / case.replace(" ", "-").replace(",", ""), [model, tmp_path / "q.gguf", "q4_0", "--imatrix",
                                                                        im], message, inputs=[model, im])
    im = _with_huge_array(tmp_path / "huge.gguf", entries, 100_000_000)  # 800 MB of hole: was 2.4 GB
    run = run_contained("quantize_command", [model, tmp_path / "q.gguf", "q4_0", "--imatrix", im, "-q"],
                        inputs=[model], tmp=tmp_path / "run-huge")
    check_contained(run, 1, "over the 16777216-byte cap", bounded=True)
    assert run.peak_rss < 512 * 2**20, f"{run.peak_rss / 2**20:.0f} MiB"


@pytest.mark.parametrize("args, message, code", [
    (["--tensor-type", "attn_qé?=q8_0"], "past ASCII: std::regex matches bytes", 2),
    (["--tensor-type", r"[\d-z]=q8_0"], "a range starting at a class", 2),
    (["--tensor-type", "attn_v=q8_0 "], "unsupported ggml type 'q8_0 '", 2),
    (["--imatrix", "{im}", "--include-weights", "blk.0", "--exclude-weights", "ffn"],
     "--include-weights and --exclude-weights cannot be used together", 2),
])
def test_second_pass_options(models: dict[str, Path], tmp_path: Path, args: list[str], message: str,
                             code: int) -> None:
    im = write_raw_imatrix(tmp_path / "m.gguf", standard_kvs(), entry_arrays(_entries(models["wide"])))
    _refused(tmp_path, [models["wide"], tmp_path / "q.gguf", "q4_k_m", *(a.format(im=im) for a in args)], message,
             code=code, inputs=[models["wide"], im])


def test_second_pass_a_unicode_escape_is_its_low_byte(models: dict[str, Path], tmp_path: Path) -> None:
    r"""std::regex<char> keeps the low byte of \u012e: '.' — llama-quantize's bytes."""
    (tmp_path / "m.gguf").symlink_to(models["wide"])
    out = _same_bytes_as_llama_quantize(tmp_path, ["--tensor-type", r"blk\u012e0\.attn_v=q8_0", "m.gguf", "o.gguf",
                                                   "q4_k_m"])
    with open_gguf(out) as g:
        assert g.tensors["blk.0.attn_v.weight"].ggml_type.name == "Q8_0"


def test_second_pass_strict_refuses_bf16_infinities(tmp_path: Path) -> None:
    import gguf

    src = tmp_path / "f32.gguf"
    w = gguf.GGUFWriter(str(src), arch="llama")
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_q.weight", np.array([[3.4e38, -3.4e38] + [1.0] * 254] * 4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _refused(tmp_path, [src, tmp_path / "q.gguf", "bf16", "--strict"],
             "tensor 'blk.0.attn_q.weight' has 8 value(s) beyond BF16's ±3.39e38", inputs=[src])
