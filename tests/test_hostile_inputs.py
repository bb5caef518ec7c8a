"""Issue 16, items 4-7: hostile inputs crafted against every command. Each gives a one-line error naming
the file and key with the right exit code (1 bad input, 2 usage) — never "internal error", never a
traceback, never an allocation sized by what the file claims, never a silent OK."""

from __future__ import annotations

import json
import re
import math
import shutil
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as V
from safetensors.torch import load_file, save_file
import torch

import hostile
from dflashkit.cli import (
    accept_command,
    convert_command,
    diff_command,
    inspect_command,
    parity_command,
    quantize_command,
)
from dflashkit.converters.convert import convert
from dflashkit.inspect import inspect_paths

QUIET = dict(progress=False, warn=lambda m: None)


def run(command, args: list[str]):
    result = CliRunner().invoke(command, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    return result


def one_line_error(result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def base(drafters, targets, tmp_path_factory) -> Path:
    """qwen3-b16 as an F32 llama.cpp GGUF with the target's tokenizer."""
    out = tmp_path_factory.mktemp("hostile") / "base.gguf"
    convert(drafters["qwen3-b16"], out, outtype="f32", target=targets[64]["gguf"], **QUIET)
    return out


def gguf_with(base: Path, tmp_path: Path, name: str, **keys: tuple) -> Path:
    return hostile.rewrite_gguf(base, tmp_path / f"{name}.gguf", {k.replace("__", "."): v for k, v in keys.items()})


# --- 4. memory driven by metadata -----------------------------------------------------------------


def test_block_count_2_32_is_refused_without_allocating(base: Path, tmp_path: Path) -> None:
    bad = hostile.rewrite_gguf(base, tmp_path / "b.gguf", {"dflash.block_count": (2**32 - 1, V.UINT32)})
    tracemalloc.start()
    try:
        report = inspect_paths([str(bad)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, peak
    messages = [f.message for f in report.files[0].findings if f.severity.name == "ERROR"]
    assert any("'dflash.block_count' = 4294967295 is out of range (expected 0 .. 4096)" in m for m in messages), messages
    assert report.exit_code() == 1
    line = one_line_error(run(parity_command, [bad, base, "--skip-weights"]))
    assert "'dflash.block_count' = 4294967295 is out of range" in line


def test_block_count_above_tensors_present(base: Path, tmp_path: Path) -> None:
    bad = hostile.rewrite_gguf(base, tmp_path / "b.gguf", {"dflash.block_count": (4000, V.UINT32)})
    line = one_line_error(run(parity_command, [bad, base, "--skip-weights"]))
    assert line == f"error: {bad}: metadata claims 4000 layers but the file holds 25 tensors"


@pytest.mark.parametrize("value, words", [
    (2**31, "'dflash.embedding_length' = 2147483648 is out of range (expected 0 .. 1048576)"),
    (1 << 20, "tensor 'fc.weight' has shape [64, 128] but the config implies [1048576, 2097152]"),
])
def test_embedding_length_checked_before_building_a_model(base: Path, tmp_path: Path, value: int, words: str) -> None:
    bad = hostile.rewrite_gguf(base, tmp_path / "e.gguf", {"dflash.embedding_length": (value, V.UINT32)})
    assert words in one_line_error(run(parity_command, [bad, base, "--skip-weights"]))


@pytest.mark.parametrize("label", [c[0] for c in hostile.HF_CASES])
def test_hostile_hf_config(label: str, drafters, tmp_path: Path) -> None:
    word = {c[0]: c[3] for c in hostile.HF_CASES}[label]
    d = hostile.make_hf_case(drafters["qwen3-b16"], tmp_path / label, label)
    line = one_line_error(run(convert_command, [d, tmp_path / "o.gguf", "-q"]))
    # main's wording for the mask check: "mask token id N is outside the vocabulary"
    assert word in line.replace("mask token id", "mask_token_id") and "config.json" in line, line
    assert not (tmp_path / "o.gguf").exists()
    line = one_line_error(run(parity_command, [d, d, "--skip-weights"]))
    assert word in line or "not a DFlash drafter" in line or "outside the vocabulary" in line, line
    if label != "architectures-list-of-int":  # inspect calls that one "not a drafter" (info), like any other model
        result = run(inspect_command, [d])
        assert result.exit_code == 1 and word in result.output.replace("mask token id", "mask_token_id")


def test_hf_target_vocab_is_bounded(targets, drafters, tmp_path: Path) -> None:
    for vocab, words in ((300_000_000, "'vocab_size' is 300000000, more than 16777216"),
                         (1_000_000, "'vocab_size' is 1000000 but the tokenizer defines ids up to 500; padding 999499 ids is more than 65536")):
        t = tmp_path / f"t{vocab}"
        shutil.copytree(targets[64]["hf"], t)
        cfg = json.loads((t / "config.json").read_text())
        cfg["vocab_size"] = vocab
        (t / "config.json").write_text(json.dumps(cfg))
        line = one_line_error(run(convert_command, [drafters["qwen3-b16"], tmp_path / "o.gguf", "--target", t, "-q"]))
        assert words in line and str(t) in line, line


def test_hf_target_text_config_not_an_object(targets, drafters, tmp_path: Path) -> None:
    t = tmp_path / "t"
    shutil.copytree(targets[64]["hf"], t)
    cfg = json.loads((t / "config.json").read_text())
    cfg["text_config"] = [1]
    (t / "config.json").write_text(json.dumps(cfg))
    # a list is no text_config: the top-level values are used, as for any text-only model
    run(convert_command, [drafters["qwen3-b16"], tmp_path / "o.gguf", "--target", t, "-q"])
    assert (tmp_path / "o.gguf").exists()


def test_numeric_arrays_cost_their_bytes(base: Path, tmp_path: Path) -> None:
    from dflashkit.io.gguf_reader import open_gguf

    values = np.random.default_rng(0).integers(2**20, 2**31 - 1, size=250_000, dtype=np.int32)  # 1 MB
    src = hostile.rewrite_gguf(base, tmp_path / "a.gguf", {"hostile.big": (values, V.ARRAY, V.INT32)})
    tracemalloc.start()
    try:
        with open_gguf(src) as g:
            kv = g.kvs["hostile.big"]
            assert len(kv.value) == values.size and kv.value[12345] == int(values[12345])
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * values.nbytes, peak  # as a list of Python ints: ~9 MB
    assert run(quantize_command, [src, tmp_path / "q.gguf", "Q8_0", "-q"]).exit_code == 0
    field = gguf.GGUFReader(tmp_path / "q.gguf").fields["hostile.big"]  # gguf-py reads the copy back
    assert np.array_equal(np.concatenate([field.parts[i] for i in field.data]), values)


# --- 5. silent acceptance -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nan_files(base: Path, tmp_path_factory) -> dict[str, Path]:
    r = gguf.GGUFReader(base)
    fc = np.array(next(t for t in r.tensors if t.name == "fc.weight").data, dtype=np.float32)
    folder = tmp_path_factory.mktemp("nan")
    one, every = fc.copy(), fc.copy()
    one[3, 5] = np.nan
    every[:] = np.nan
    inf = fc.copy()
    inf[0, 0] = np.inf
    return {
        "one": hostile.rewrite_gguf(base, folder / "one.gguf", replace={"fc.weight": one}),
        "all": hostile.rewrite_gguf(base, folder / "all.gguf", replace={"fc.weight": every}),
        "inf": hostile.rewrite_gguf(base, folder / "inf.gguf", replace={"fc.weight": inf}),
    }


@pytest.mark.parametrize("which, counts", [("one", "A 0, B 1"), ("all", "A 0, B 8192"), ("inf", "A 0, B 1")])
def test_diff_fails_on_nonfinite(base: Path, nan_files, which: str, counts: str) -> None:
    result = run(diff_command, [base, nan_files[which]])
    assert result.exit_code == 1
    assert f"FAIL: 1 tensor(s) hold NaN/Inf values: fc.weight ({counts})" in result.output
    doc = strict_json(run(diff_command, [base, nan_files[which], "--format", "json"]).stdout)
    sections = {s["id"]: s for s in doc["sections"]}
    fc = next(t for t in sections["tensors"]["rows"] if t["tensor"] == "fc.weight")
    assert doc["level"] == "error" and doc["summary"]["exit_code"] == 1
    assert fc["nonfinite_b"] == int(counts.split("B ")[1]) and fc["nonfinite_a"] == 0
    assert fc["rel_rms"] == "nan"  # rendered as a string, never as a bare NaN
    # NaN on both sides is still an error (it used to read "OK ... 0")
    both = run(diff_command, [nan_files[which], nan_files[which]])
    assert both.exit_code == 1 and "hold NaN/Inf values" in both.output


def test_parity_fails_on_nonfinite_outputs(base: Path, nan_files) -> None:
    for args in ([nan_files["one"], base, "--skip-weights"], [base, nan_files["all"], "--skip-weights"]):
        result = run(parity_command, args)
        assert result.exit_code == 1
        assert "FAIL: the drafters' outputs hold NaN/Inf values (check the weights with dflash-diff)" in result.output
        assert "hidden-state rel RMS 0," not in result.output
    doc = strict_json(run(parity_command, [nan_files["one"], base, "--skip-weights", "--json"]).stdout)
    assert doc["level"] == "error"


def _hf_copy(drafters, tmp_path: Path) -> Path:
    d = tmp_path / "d"
    shutil.copytree(drafters["qwen3-b16"], d)
    return d


@pytest.mark.parametrize("how, words", [
    ("missing", "no config.json — expected an HF drafter checkpoint directory"),
    ("directory", "config.json: is a directory, not a file — config.json must be a JSON file"),  # issue 26 #7
    ("invalid", "config.json: cannot read JSON (Expecting value"),
])
def test_inspect_refuses_hf_config_as_convert_does(drafters, tmp_path: Path, how: str, words: str) -> None:
    d = _hf_copy(drafters, tmp_path)
    (d / "config.json").unlink()
    if how == "directory":  # unreadable (as root, chmod cannot make a file unreadable)
        (d / "config.json").mkdir()
    elif how == "invalid":
        (d / "config.json").write_text("")
    result = run(inspect_command, [d])
    assert result.exit_code == 1
    # main renders inspect through reporting.Report: one findings-table row "error  ID  MESSAGE"
    assert re.search(rf"^  error +drafter\.config_invalid +{re.escape(str(d))}", result.output, re.M), result.output
    assert words in result.output
    assert one_line_error(run(convert_command, [d, tmp_path / "o.gguf", "-q"])).startswith(f"error: {d}")


def test_inspect_refuses_dtypes_convert_refuses(drafters, tmp_path: Path) -> None:
    d = _hf_copy(drafters, tmp_path)
    tensors = load_file(d / "model.safetensors")
    name = "model.norm.weight" if "model.norm.weight" in tensors else "norm.weight"
    tensors[name] = torch.ones(64, dtype=torch.int16)
    save_file(tensors, str(d / "model.safetensors"))
    result = run(inspect_command, [d])
    assert result.exit_code == 1
    # one wording in both commands (inspect names the checkpoint and who refuses it; convert, the shard)
    message = f"tensor '{name}' has dtype I16; drafter weights must be float (BF16, F16, F32, F64)"
    assert re.search(rf"^  error +drafter\.dtype +{re.escape(f'{d}: {message}')} \(dflash-convert, dflash-quantize, "
                     r"dflash-parity and dflash-accept refuse it\)", result.output, re.M), result.output
    line = one_line_error(run(convert_command, [d, tmp_path / "o.gguf", "-q"]))
    assert line == f"error: {d / 'model.safetensors'}: {message}"


def test_parity_refuses_negative_taps(base: Path, tmp_path: Path) -> None:
    bad = hostile.rewrite_gguf(base, tmp_path / "t.gguf", {"dflash.target_layers": ([-3, 9], V.ARRAY, V.INT32)})
    line = one_line_error(run(parity_command, [bad, base, "--skip-weights"]))
    # main's wording for the tap rule (one rule list in dflashkit.spec_checks, shared with translation)
    assert line == (f"error: {bad}: target layer ids have a negative id: [-4, 8] — refusing to run this drafter "
                    "(dflash-inspect lists every problem)")


def test_hf_convert_refuses_mask_past_config_vocab(drafters, tmp_path: Path) -> None:
    d = hostile.make_hf_case(drafters["qwen3-b16"], tmp_path / "m", "mask-past-vocab")
    line = one_line_error(run(convert_command, [d, tmp_path / "o.gguf", "-q"]))
    # main's wording for the mask check (one check shared by convert and translate, dflashkit.spec_checks)
    assert line == f"error: {d / 'config.json'}: mask token id 512 is outside the vocabulary (512 tokens)"


# --- 6. wrong GGUF types and ranges name the key ----------------------------------------------------


@pytest.mark.parametrize("key, value, words", [
    ("general.file_type", ("q8", V.STRING), "'general.file_type' must be an integer, got string 'q8'"),
    ("general.file_type", ([1, 2], V.ARRAY, V.INT32), "'general.file_type' must be an integer, got array [1, 2]"),
    ("tokenizer.ggml.mask_token_id", ("500", V.STRING), "'tokenizer.ggml.mask_token_id' must be an integer, got string '500'"),
    # zero sizes: main's wording from the shared spec checks (dflashkit.spec_checks), in every command
    ("dflash.embedding_length", (0, V.UINT32), "hidden_size must be >= 1, got 0"),
    ("dflash.attention.head_count_kv", (0, V.UINT32), "n_kv_heads must be >= 1, got 0"),
    ("dflash.attention.layer_norm_rms_epsilon", (float("nan"), V.FLOAT32), "'dflash.attention.layer_norm_rms_epsilon' = nan is out of range"),
    ("dflash.rope.freq_base", (1e308, V.FLOAT64), "'dflash.rope.freq_base' = 1e+308 is out of range"),
    ("dflash.block_size", (2**40, V.UINT64), "'dflash.block_size' = 1099511627776 is out of range (expected 0 .. 4096)"),
    ("dflash.target_layers", ([], V.ARRAY, V.INT32), "'dflash.target_layers' must list 1 .. 4096 integers, got 0"),
])
def test_wrong_gguf_metadata_names_the_key(base: Path, tmp_path: Path, key: str, value: tuple, words: str) -> None:
    bad = hostile.rewrite_gguf(base, tmp_path / "k.gguf", {key: value})
    if key == "general.file_type":  # read by translation and diff only
        line = one_line_error(run(convert_command, [bad, tmp_path / "o.gguf", "-q"]))
        assert words in line and str(bad) in line
        result = run(diff_command, [base, bad])
        assert result.exit_code == 0 and "file type" in result.output  # shown, never interpreted
        return
    assert words in one_line_error(run(parity_command, [bad, base, "--skip-weights"]))
    assert words in one_line_error(run(convert_command, [bad, tmp_path / "o.gguf", "-q"]))
    result = run(inspect_command, [bad])
    assert result.exit_code == 1 and words in result.output


@pytest.mark.parametrize("key, sub", [("tokenizer.ggml.merges", V.STRING), ("tokenizer.ggml.token_type", V.INT32),
                                      ("hostile.empty", V.FLOAT32)])
def test_empty_arrays_are_copied_by_every_writer(base: Path, tmp_path: Path, key: str, sub: V) -> None:
    src = hostile.rewrite_gguf(base, tmp_path / "e.gguf", {key: ([], V.ARRAY, sub)})
    for command, args in ((quantize_command, [src, tmp_path / "q.gguf", "Q8_0", "-q"]),
                          (convert_command, [src, tmp_path / "t.gguf", "--dialect", "luce", "-q"])):
        out = args[1]
        assert run(command, args).exit_code == 0
        if command is convert_command and not key.startswith("tokenizer."):
            continue  # translation carries the tokenizer keys, not unknown ones
        field = gguf.GGUFReader(out).fields[key]  # gguf-py, the reference reader, reads it back empty
        assert field.types[0] == V.ARRAY and field.contents() == []
        assert int(field.parts[3][0]) == sub and int(field.parts[4][0]) == 0  # element type kept, count 0


def test_nul_in_shard_name(drafters, tmp_path: Path) -> None:
    d = tmp_path / "d"
    shutil.copytree(drafters["sharded"], d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "model\x00.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    line = one_line_error(run(convert_command, [d, tmp_path / "o.gguf", "-q"]))
    assert "model.safetensors.index.json" in line and "\x00" not in line


# --- 7. smaller -----------------------------------------------------------------------------------


def test_tensor_name_with_newline_stays_on_one_line(drafters, tmp_path: Path) -> None:
    d = _hf_copy(drafters, tmp_path)
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.0.evil\nname"] = torch.ones(4)
    save_file(tensors, str(d / "model.safetensors"))
    line = one_line_error(run(convert_command, [d, tmp_path / "o.gguf", "-q"]))
    assert "evil\\nname" in line


def test_huge_shape_is_quoted_short(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [1] * 300_000 + [2], "data_offsets": [0, 4]}}).encode()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    (d / "config.json").write_text("{}")
    for result in (run(convert_command, [d, tmp_path / "o.gguf", "-q"]), run(inspect_command, [d])):
        assert result.exit_code == 1
        assert max(len(line) for line in result.output.splitlines()) < 2100


def test_json_output_is_strict(base: Path, tmp_path: Path) -> None:
    bad = hostile.rewrite_gguf(base, tmp_path / "n.gguf", {"dflash.final_logit_softcapping": (float("inf"), V.FLOAT32),
                                                           "hostile.nan": (float("nan"), V.FLOAT32)})
    result = run(inspect_command, [bad, "--json"])
    doc = strict_json(result.stdout)
    assert result.exit_code == 1
    errors = [f for f in doc["files"][0]["findings"] if f["severity"] == "error"]
    assert [f["id"] for f in errors] == ["drafter.metadata_invalid"], errors
    assert "'dflash.final_logit_softcapping' = inf is out of range" in errors[0]["message"]
    # every JSON writer goes through one renderer: non-finite numbers become the reports' strings
    from dflashkit.bounds import dumps

    assert strict_json(dumps({"x": [math.nan, math.inf, -math.inf, 1.5]})) == {"x": ["nan", "inf", "-inf", 1.5]}


def test_architectures_as_a_string_is_accepted(drafters, tmp_path: Path) -> None:
    d = hostile.hf_copy(drafters["qwen3-b16"], tmp_path / "s" / "m", edit=lambda c: c.update(architectures="DFlashDraftModel"))
    listed = hostile.hf_copy(drafters["qwen3-b16"], tmp_path / "l" / "m")  # same directory name: same general.name
    assert run(convert_command, [d, tmp_path / "s.gguf", "-q"]).exit_code == 0
    assert run(convert_command, [listed, tmp_path / "l.gguf", "-q"]).exit_code == 0
    assert gguf.GGUFReader(tmp_path / "s.gguf").fields["general.architecture"].contents() == "dflash"
    assert (tmp_path / "s.gguf").read_bytes() == (tmp_path / "l.gguf").read_bytes()  # same as the list form
    d2 = hostile.hf_copy(drafters["qwen3-b16"], tmp_path / "x", edit=lambda c: c.update(architectures="LlamaForCausalLM"))
    line = one_line_error(run(convert_command, [d2, tmp_path / "x.gguf", "-q"]))
    assert "architecture 'LlamaForCausalLM' is not a DFlash drafter" in line


@pytest.mark.parametrize("command, args", [
    (diff_command, ["--threshold", "nan"]),
    (diff_command, ["--threshold", "inf"]),
    (parity_command, ["--threshold-kl", "nan"]),
    (convert_command, ["--mask-token-id", str(2**32)]),
    (convert_command, ["--num-target-layers", "5000"]),
])
def test_option_bounds_are_usage_errors(base: Path, tmp_path: Path, command, args: list[str]) -> None:
    positional = [base, tmp_path / "o.gguf"] if command is convert_command else [base, base]
    result = run(command, positional + args)
    assert result.exit_code == 2, result.output
    assert args[0] in result.output


def test_accept_bad_block_is_exit_1_and_pickle_targets_refused(base: Path, targets, tmp_path: Path) -> None:
    one = hostile.rewrite_gguf(base, tmp_path / "b1.gguf", {"dflash.block_size": (1, V.UINT32)})
    line = one_line_error(run(accept_command, [one, "--target", targets[64]["hf"], "--max-prompts", "1",
                                               "--max-new-tokens", "2", "-q"]))
    assert line.endswith("b1.gguf: block_size 1 drafts nothing")
    zero = hostile.rewrite_gguf(base, tmp_path / "b0.gguf", {"dflash.block_size": (0, V.UINT32)})
    line = one_line_error(run(accept_command, [zero, "--target", targets[64]["hf"], "-q"]))
    assert "block_size must be >= 1, got 0" in line  # main's wording (dflashkit.spec_checks)
    t = tmp_path / "pickle-target"
    shutil.copytree(targets[64]["hf"], t)
    (t / "model.safetensors").rename(t / "pytorch_model.bin")
    line = one_line_error(run(accept_command, [base, "--target", t, "--max-prompts", "1", "-q"]))
    assert f"only pickle weights ({t / 'pytorch_model.bin'})" in line and "never unpickles" in line


def test_deeply_nested_json_is_a_one_line_error(tmp_path: Path) -> None:
    # 60 000 nested objects in --chat-template-kwargs (usage: exit 2) or in a prompts line (bad input: exit 1)
    trained = Path(__file__).resolve().parents[1] / "fixtures" / "trained"
    common = [str(trained / "drafter"), "--target", str(trained / "target"), "--max-prompts", "1", "-q"]
    r = CliRunner().invoke(accept_command, [*common, "--chat-template-kwargs", '{"a":' * 60000 + "1" + "}" * 60000])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == ("error: --chat-template-kwargs: JSON nested too deeply — give an object such as "
                                "'{\"enable_thinking\": false}'")
    prompts = tmp_path / "deep.jsonl"
    prompts.write_text("[" * 60000 + "]" * 60000 + "\n")
    r = CliRunner().invoke(accept_command, [*common, "--prompts", str(prompts)])
    assert r.exit_code == 1 and r.output.strip().startswith(f"error: {prompts}:1: JSON nested too deeply"), r.output


@pytest.mark.parametrize("where, name", [("drafter", "generation_config.json"), ("drafter", "README.md"),
                                         ("drafter", "mask_embedding.pt"), ("target", "tokenizer_config.json")])
def test_a_fifo_side_file_is_named_not_skipped(tmp_path: Path, where: str, name: str) -> None:
    # gguf-py and a plain is_file() skip a FIFO silently (the output then lacks what the file says); reading one
    # blocks: it is refused by name instead
    import os

    trained = Path(__file__).resolve().parents[1] / "fixtures" / "trained"
    dirs = {w: shutil.copytree(trained / w, tmp_path / w) for w in ("drafter", "target")}
    fifo = dirs[where] / name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    out = tmp_path / "d.gguf"
    r = CliRunner().invoke(convert_command, [str(dirs["drafter"]), str(out), "--target", str(dirs["target"]), "-q"])
    assert r.exit_code == 1, r.output
    assert r.output.strip() == f"error: {fifo}: is a FIFO, not a regular file — replace it with the file, or remove it"
    assert not out.exists()


def test_an_array_of_many_arrays_is_capped_before_it_is_built(tmp_path: Path) -> None:
    # 12 bytes per empty inner array: 11 M of them (132 MB) once cost inspect 2.5 GB and 90 s of Python lists
    import struct

    path = tmp_path / "arrays.gguf"
    n = 70_000
    arch = struct.pack("<Q", 20) + b"general.architecture" + struct.pack("<IQ", 8, 6) + b"dflash"
    arrays = struct.pack("<Q", 8) + b"x.arrays" + struct.pack("<IIQ", 9, 9, n) + struct.pack("<IQ", 0, 0) * n
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + arch + arrays)
    r = CliRunner().invoke(inspect_command, [str(path), "--format", "json"])
    findings = {f["id"]: f["message"] for f in json.loads(r.stdout)["files"][0]["findings"]}
    assert r.exit_code == 1
    assert findings["gguf.array_length"] == (f"{path}: key 'x.arrays' holds {n} arrays, over the cap of 65536 (no "
                                             "loader reads an array of arrays)")
