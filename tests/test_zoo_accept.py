"""Greedy ``dflash-accept`` reproduces the target for every convertible zoo drafter, HF and GGUF forms (issue 14).

Every fixture of fixtures/make_zoo.py that dflashkit converts (each written by its own project's classes) runs
the draft–verify loop at temperature 0 in three forms: its HF directory, dflash-convert's GGUF (f32 or bf16),
and for one fixture per family kind a quantized GGUF (Q8_0 written by dflash-convert; one Q4_K_M file from
dflash-quantize). Each form's output must equal the target's own greedy continuation, computed independently
by transformers' ``generate`` on the HF target (never by dflashkit's runtime). Library calls for every
fixture, plus one ``dflash-accept`` CLI run (its ``--trace`` holds the ids).

Left out on purpose: the refused fixtures (``*-gated``, ``*-d2t-dup``, ``deepseekv4-dspark``: dflash-convert
and the runtime refuse them, tests/test_zoo_dspark.py), and ``zlab-no-taps``' HF form (no taps in its config:
refused; its GGUF converted with ``--target-layer-ids`` runs).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import make_zoo

from dflashkit.converters.convert import convert

warnings.filterwarnings("ignore", module="transformers")
pytest.importorskip("dflash.model")
pytest.importorskip("speculators.models.dspark")

#: refused by dflash-convert and the runtime (their messages: tests/test_zoo_dspark.py)
REFUSED = ("spec-dspark-gated", "specforge-dspark-gated", "qwen3-dspark-d2t-dup", "deepseekv4-dspark")
#: HF forms that cannot run (the config lacks what the runtime needs; its GGUF gets it from a flag)
NO_HF_FORM = ("zlab-no-taps",)
CONVERT_FLAGS = {"zlab-no-taps": {"target_layer_ids": list(make_zoo.TAPS)}}
#: one fixture per family kind also runs as a Q8_0 GGUF
Q8_0 = ("zlab-sinks", "zlab-dflash2", "spec-dflash", "spec-dflash2", "spec-dspark", "qwen3-dspark", "gemma4-dspark")
NAMES = [n for n in make_zoo.FIXTURES if n not in REFUSED]
MAX_NEW = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    return make_zoo.make_zoo(tmp_path_factory.mktemp("zoo-accept"), NAMES)


@pytest.fixture(scope="session")
def runner(zoo):
    from dflashkit.runtime import HFTarget

    return HFTarget(zoo[0])


@pytest.fixture(scope="session")
def greedy(runner):
    """prompt ids → the target's greedy continuation (transformers' generate), cached per prompt."""
    cache: dict[tuple[int, ...], list[int]] = {}

    def continuation(ids: list[int]) -> list[int]:
        key = tuple(ids)
        if key not in cache:
            with torch.inference_mode():
                out = runner.model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                            eos_token_id=None, pad_token_id=0)
            cache[key] = out[0, len(ids):].tolist()
        return cache[key]

    return continuation


def _prompts():
    from dflashkit.accept import Prompt

    return [Prompt("chat", messages=(("user", "The quick brown fox"),)), Prompt("code", text="def f(x): return")]


def _forms(zoo, name: str, tmp_path: Path) -> list[Path]:
    target, made = zoo
    layout = make_zoo.FIXTURES[name].layout
    forms = [] if name in NO_HF_FORM else [made[name]]
    outtypes = ["bf16" if layout == "z-lab" else "f32"] + (["q8_0"] if name in Q8_0 else [])
    for outtype in outtypes:
        out = tmp_path / f"{name}-{outtype}.gguf"
        convert(made[name], out, outtype=outtype, target=target, progress=False, warn=lambda _: None,
                **CONVERT_FLAGS.get(name, {}))
        forms.append(out)
    return forms


@pytest.mark.parametrize("name", NAMES)
def test_greedy_accept_reproduces_the_target(name: str, zoo, runner, greedy, tmp_path: Path) -> None:
    from dflashkit.accept import run_acceptance

    forms = _forms(zoo, name, tmp_path)
    result = run_acceptance(runner, forms, _prompts(), max_new_tokens=MAX_NEW, warmup=False, ignore_eos=True)
    assert [d.path for d in result.drafters] == [str(f) for f in forms]
    for i, ids in enumerate(result.prompt_ids):
        expect = greedy(ids)
        assert len(expect) == MAX_NEW
        for d in result.drafters:
            assert d.runs[i].output_ids == expect, (d.path, result.prompts[i].id)
    kinds = [d.info.kind for d in result.drafters]  # the forms really are what they say
    assert kinds == (["gguf"] * len(forms) if name in NO_HF_FORM else ["hf"] + ["gguf"] * (len(forms) - 1))
    if name in Q8_0:
        assert "Q8_0" in result.drafters[-1].info.tensor_types


def test_q4_k_m_gguf_reproduces_the_target(zoo, runner, greedy, tmp_path: Path) -> None:
    """A dflash-quantize Q4_K_M file (these 64-wide rows fall back to Q5_0 / Q8_0, as llama-quantize does)."""
    from dflashkit.accept import run_acceptance
    from dflashkit.quantize.gguf_file import quantize_gguf

    target, made = zoo
    f32 = tmp_path / "specforge-dspark.gguf"
    convert(made["specforge-dspark"], f32, outtype="f32", target=target, progress=False, warn=lambda _: None)
    q4 = tmp_path / "specforge-dspark-q4_k_m.gguf"
    quantize_gguf(f32, q4, "Q4_K_M", progress=False, warn=lambda _: None)
    result = run_acceptance(runner, [q4], _prompts(), max_new_tokens=MAX_NEW, warmup=False, ignore_eos=True)
    assert {"Q5_0", "Q8_0"} <= set(result.drafters[0].info.tensor_types)
    for i, ids in enumerate(result.prompt_ids):
        assert result.drafters[0].runs[i].output_ids == greedy(ids)


def test_cli_greedy_accept_reproduces_the_target(zoo, greedy, tmp_path: Path) -> None:
    """``dflash-accept`` itself (exit 0, the report names the family, the trace's ids equal the target's)."""
    from click.testing import CliRunner

    from dflashkit.cli import accept_command

    target, made = zoo
    gguf_path = tmp_path / "spec-dspark.gguf"
    convert(made["spec-dspark"], gguf_path, outtype="f32", target=target, progress=False, warn=lambda _: None)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "code", "text": "def f(x): return"}) + "\n")
    trace = tmp_path / "trace.jsonl"
    res = CliRunner().invoke(accept_command, ["--target", str(target), str(made["spec-dspark"]), str(gguf_path),
                                              "--prompts", str(prompts), "--max-new-tokens", str(MAX_NEW),
                                              "--ignore-eos", "--temperature", "0", "--trace", str(trace), "--json",
                                              "-q"])
    assert res.exit_code == 0, res.output
    families = [row["family"] for row in json.loads(res.stdout)["sections"][0]["rows"]]
    assert families == ["speculators DSpark", "DSpark (llama.cpp GGUF)"]
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [line["drafter"] for line in lines] == [str(made["spec-dspark"]), str(gguf_path)]
    for line in lines:
        assert line["temperature"] == 0 and line["output_ids"] == greedy(line["prompt_ids"])
