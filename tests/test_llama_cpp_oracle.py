"""llama.cpp's convert_hf_to_gguf.py as the oracle for dflash-convert (issue 13's exactness check).

Runs only with DFLASHKIT_LLAMA_CPP_SRC pointing at llama.cpp's source (vendor/llama.cpp of the
llama-cpp-python sdist); skips otherwise. llama.cpp's BPE pre-tokenizer hash table is bypassed for the
tiny fixture tokenizers (see tests/llama_cpp_oracle.py): only that one lookup, nothing else.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

import make_drafters
from conftest import target_for
from llama_cpp_oracle import OUTTYPES, OracleError, compare_gguf, read_gguf, run_oracle

from dflashkit.converters.convert import convert

# Keys llama.cpp derives from the directory name and parameter count (its metadata heuristics:
# "qwen3-b16" -> general.name "Qwen3 B16", general.size_label "82K", general.type "model"); dflashkit
# writes general.name from the directory and neither of the other two.
DIRECTORY_DERIVED_KEYS = ("general.name", "general.type", "general.size_label")
ZLAB_FAMILIES = ("qwen3-b16", "dflash2")


@pytest.fixture(scope="module")
def oracle_outputs(drafters: dict[str, Path], targets, tmp_path_factory: pytest.TempPathFactory,
                   oracle_build: str) -> dict[tuple[str, str], Path]:
    """(family, outtype) -> llama.cpp's output, converted once per module and pinned build."""
    root = tmp_path_factory.mktemp(f"oracle-{oracle_build}")
    outputs = {}
    for family in ZLAB_FAMILIES:
        for outtype in OUTTYPES:
            outputs[family, outtype] = run_oracle(
                drafters[family], root / f"{family}-{outtype}.gguf", outtype=outtype,
                target_dir=target_for(family, targets, "hf"), build=oracle_build,
            )
    return outputs


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("family", ZLAB_FAMILIES)
def test_zlab_convert_matches_llama_cpp(family: str, outtype: str, drafters, targets, oracle_outputs, tmp_path: Path) -> None:
    # Every metadata key (type and value) and every tensor (type, shape, bytes) as llama.cpp writes it.
    ours = tmp_path / "ours.gguf"
    convert(drafters[family], ours, outtype=outtype, target=target_for(family, targets, "hf"), progress=False)
    assert compare_gguf(oracle_outputs[family, outtype], ours, ordered=False, ignore_keys=DIRECTORY_DERIVED_KEYS) == []


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("family", ZLAB_FAMILIES)
def test_zlab_convert_byte_identical_to_llama_cpp(family: str, outtype: str, drafters, targets, oracle_outputs, tmp_path: Path) -> None:
    # key order, tensor order, general.type / name / size_label as llama.cpp derives them: the same bytes
    ours = tmp_path / "ours.gguf"
    convert(drafters[family], ours, outtype=outtype, target=target_for(family, targets, "hf"), progress=False)
    assert compare_gguf(oracle_outputs[family, outtype], ours) == []
    assert ours.read_bytes() == oracle_outputs[family, outtype].read_bytes()


# --------------------------------------------------------------------------------------------
# the harness itself


def test_oracle_applies_llama_cpps_transformations(drafters, oracle_outputs) -> None:
    # Taps +1, q8_0 falls back to F16 for rows not a multiple of 32, 1-D stays F32, bytes are the
    # source's: checked against the safetensors file directly, not against dflashkit.
    import torch
    from safetensors.torch import load_file

    meta, tensors = read_gguf(oracle_outputs["qwen3-b16", "q8_0"])
    values = {k: v for k, _, v in meta}
    assert values["general.architecture"] == "dflash"
    assert values["dflash.target_layers"] == [i + 1 for i in make_drafters.FAMILIES["qwen3-b16"]["dflash_config"]["target_layer_ids"]]
    assert values["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    by_name = {name: (type_, shape, data) for name, type_, shape, data in tensors}
    assert by_name["blk.0.attn_q.weight"][0] == "Q8_0"
    assert by_name["blk.0.attn_q_norm.weight"][0] == "F32"
    _, f32_tensors = read_gguf(oracle_outputs["qwen3-b16", "f32"])
    source = load_file(str(drafters["qwen3-b16"] / "model.safetensors"))
    fc = {name: data for name, _, _, data in f32_tensors}["fc.weight"]
    assert source["fc.weight"].dtype == torch.bfloat16
    assert fc == source["fc.weight"].float().numpy().astype("<f4").tobytes()  # bf16 -> f32 is exact


def test_compare_gguf_reports_each_kind_of_difference(oracle_outputs, tmp_path: Path) -> None:
    src = oracle_outputs["qwen3-b16", "f32"]
    assert compare_gguf(src, src) == []
    meta, tensors = read_gguf(src)
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(tmp_path / "edited.gguf"), "dflash", use_temp_file=False)
    writer.kv_data[0].pop("general.architecture", None)  # the writer adds it first; re-added below in order
    for key, _, value in meta:
        field = reader.fields[key]
        vtype = field.types[0]
        if key == "dflash.block_size":
            value = 8
        if key == "tokenizer.chat_template":
            continue
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for name, type_, shape, data in tensors:
        arr = np.frombuffer(data, dtype=np.float32).reshape(tuple(reversed(shape))).copy()
        if name == "fc.weight":
            arr.view(np.uint8).reshape(-1)[0] ^= 1  # one byte
        if name == "output_norm.weight":
            continue
        writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    diffs = compare_gguf(src, tmp_path / "edited.gguf")
    assert diffs == [
        "metadata tokenizer.chat_template: only in a",
        "metadata dflash.block_size: 16 != 8",
        "tensor output_norm.weight: only in a",
        "tensor fc.weight: 1 of 32768 bytes differ",
    ]


def test_oracle_error_is_the_converters_last_line(drafters, targets, tmp_path: Path) -> None:
    broken = tmp_path / "drafter"
    shutil.copytree(drafters["qwen3-b16"], broken)
    with pytest.raises(OracleError) as info:
        run_oracle(broken, tmp_path / "out.gguf", outtype="f32")  # no --target-model-dir
    assert info.value.message == (
        "ValueError: DFlash draft model requires --target-model-dir to be specified. "
        "Please provide the path to the target model directory containing the tokenizer."
    )


def test_model_card_metadata_as_llama_cpp_derives_it(drafters, targets, tmp_path: Path) -> None:
    # general.* from a README.md front matter and generation_config.json go through gguf-py's
    # Metadata heuristics on both sides (llama.cpp: its own gguf-py; dflashkit: gguf 0.19 from PyPI,
    # which no longer reads generation_config's repetition_penalty — dflashkit restores that fallback)
    d = tmp_path / "Qwen3-8B-DFlash-b16"
    shutil.copytree(drafters["qwen3-b16"], d)
    (d / "README.md").write_text(
        "---\nlicense: apache-2.0\nbase_model: Qwen/Qwen3-8B\nlanguage:\n- en\ntags:\n- dflash\n---\n# a drafter\n"
    )
    (d / "generation_config.json").write_text('{"temperature": 0.6, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.05}')
    oracle = run_oracle(d, tmp_path / "oracle.gguf", outtype="bf16", target_dir=target_for("qwen3-b16", targets, "hf"))
    ours = tmp_path / "ours.gguf"
    convert(d, ours, outtype="bf16", target=target_for("qwen3-b16", targets, "hf"), progress=False)
    assert compare_gguf(oracle, ours) == []
    assert ours.read_bytes() == oracle.read_bytes()
    values = {k: v for k, _, v in read_gguf(ours)[0]}
    assert values["general.sampling.penalty_repeat"] == pytest.approx(1.05)
    assert values["general.base_model.0.name"] == "Qwen3 8B"
