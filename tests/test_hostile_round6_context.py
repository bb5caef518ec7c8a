"""Hostile round 6 (issue 56): memory bounded by what a level measures, not by the context file; every parity level
checked against the context of whatever the target is; prompt labels that are strings; a GGUF's tensors named as
the file names them.

Each case runs the command as a user does, in a child (`contained.run_contained`: its peak RSS, its inputs' bytes,
nothing left behind), and plants its own input.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

import hostile
from dflashkit.errors import UsageError
from contained import check_contained, run_contained

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
LONG = ROOT / "fixtures" / "trained-long"

pytestmark = pytest.mark.slow  # every case runs a whole command in a child


def _big_context(path: Path, size: int, *, one_line: bool = False, emoji: bool = False) -> Path:
    """``size`` bytes of the long pair's own held-out text, repeated (one line: every newline a space; emoji: runs
    of 4-byte characters a byte-level BPE makes ~4 tokens each, no newline)."""
    text = (LONG / "context.txt").read_text(encoding="utf-8") + "\n"
    if one_line:
        text = text.replace("\n", " ")
    if emoji:
        text = "\U0001F600\U0001F389\U0001F680" * 1000 + " "
    unit = text.encode("utf-8")
    with open(path, "wb") as f:
        for _ in range(size // len(unit)):
            f.write(unit)
        f.write(unit[: size % len(unit)])
    return path


# ---- the context file: read as far as the levels need ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lines", "one-line", "emoji"])
def test_a_64_mib_context_file_costs_what_the_level_reads(tmp_path: Path, kind: str) -> None:
    size = (64 << 20) - 1 if kind != "emoji" else (64 << 20) // 12_001 * 12_001  # (whole characters)
    context = _big_context(tmp_path / "context.txt", size, one_line=kind == "one-line", emoji=kind == "emoji")
    out = tmp_path / "accept.json"
    run = run_contained("accept_command", [LONG / "drafter", "--target", LONG / "target", "--prompts",
                                           LONG / "prompts.jsonl", "--max-prompts", "2", "--max-new-tokens", "8",
                                           "--context", "0,512", "--context-file", context, "-q", "-o", out],
                        inputs=[LONG, context], tmp=tmp_path / "run")
    check_contained(run, 0, bounded=True)
    # the model and torch take ~450 MB here; the whole file's encoding took 2.6 GB for 16 MB before
    assert run.peak_rss < 1 << 30, f"peak RSS {run.peak_rss / 2**20:.0f} MiB"
    rows = next(s for s in json.loads(out.read_text())["sections"] if s["id"] == "by_context")["rows"]
    assert [r["context"] for r in rows] == [0, 512]


def test_a_level_past_the_targets_context_is_refused_before_the_file_is_encoded(tmp_path: Path) -> None:
    context = _big_context(tmp_path / "context.txt", 64 << 20)
    run = run_contained("accept_command", [LONG / "drafter", "--target", LONG / "target", "--prompts",
                                           LONG / "prompts.jsonl", "--context", "0,1M", "--context-file", context, "-q"],
                        inputs=[LONG, context], tmp=tmp_path / "run")
    check_contained(run, 2, "--context 1M: 1,048,576 + ", bounded=True)
    assert "exceed target " in run.stderr and "context of 4,096 (max_position_embeddings)" in run.stderr


def test_the_window_encodes_as_the_tokenizer_encodes_the_whole_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks are cut at line starts, where the byte-level BPE never joins two pieces: the ids are the tokenizer's
    own ids of the whole text, even with a chunk every few hundred characters."""
    import dflashkit.accept.context as context_module

    tok = AutoTokenizer.from_pretrained(str(LONG / "target"))
    text = (LONG / "context.txt").read_text(encoding="utf-8")
    whole = tok.encode(text, add_special_tokens=False)
    monkeypatch.setattr(context_module, "ENCODE_CHUNK_CHARS", 300)
    assert context_module.encode_window(tok, text, len(whole) + 1).tolist() == whole
    opening = context_module.encode_window(tok, text, 100, min_chars=0)
    assert 100 <= len(opening) < 400 and opening.tolist() == whole[: len(opening)]


# ---- parity: every level against the target's context, whatever the target; its state bounded -------------------


@pytest.fixture(scope="module")
def target_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF target whose header says a context of 4,096 (the levels are checked before its tensors are read)."""
    from make_target import make_gguf_target, make_hf_target  # (conftest puts fixtures/ on the path)

    root = tmp_path_factory.mktemp("target")
    return make_gguf_target(root / "target.gguf", make_hf_target(root / "hf", hidden_size=64, n_layers=4))


@pytest.mark.parametrize("where", ["gguf-target", "no-target"])
def test_parity_levels_fit_the_context_whatever_the_target(tmp_path: Path, target_gguf: Path, where: str) -> None:
    extra = ["--target", target_gguf] if where == "gguf-target" else []
    run = run_contained("parity_command", [TRAINED / "drafter", TRAINED / "drafter", "--context", "0,1024k", *extra],
                        inputs=[TRAINED, target_gguf], tmp=tmp_path / "run")
    whose = ("the target's context of 4,096 (target.gguf: context_length)" if extra else
             "the drafter's own context of 4,096 (its max_position_embeddings / context_length; no --target)")
    check_contained(run, 2, f"--context 1M: 1,048,576 + 17 of the rounds exceed {whose} — give levels up to 4,079",
                    bounded=True)
    assert run.elapsed_s < 60 and run.peak_rss < 1 << 30


def test_parity_bounds_a_levels_state_before_building_it(tmp_path: Path) -> None:
    """A drafter that claims 2 Mi positions: the context's state at 1 Mi positions (8 KB each) is refused in
    advance — it reached 8.5 GB before."""
    drafter = hostile.hf_copy(TRAINED / "drafter", tmp_path / "drafter",
                              lambda c: c.update(max_position_embeddings=1 << 21))
    run = run_contained("parity_command", [drafter, drafter, "--context", "0,1024k"], inputs=[drafter],
                        tmp=tmp_path / "run")
    check_contained(run, 2, "--context 1M: 1,048,593 context positions hold about 8.00 GiB of the run's state "
                    "(8,192 bytes a position: the context's 512 features, each drafter's fc output and K/V of 2 "
                    "layers), over the 1.00 GiB bound — give levels up to 131,055", bounded=True)
    assert run.peak_rss < 1 << 30


# ---- prompt labels -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, kind", [("true", "boolean"), ("[1, 2]", "list"), ('{"a": 1}', "object"),
                                         ("NaN", "number"), ("3", "number")])
def test_a_category_that_is_not_a_string_is_named(tmp_path: Path, value: str, kind: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "one"}\n{"text": "two", "category": ' + value + "}\n")
    run = run_contained("accept_command", [TRAINED / "drafter", "--target", TRAINED / "target", "--prompts", prompts],
                        inputs=[TRAINED, prompts], tmp=tmp_path / "run")
    check_contained(run, 1, f"{prompts}:2: 'category' must be a string, got a JSON {kind} — quote it", bounded=True)


def test_a_900_kb_category_is_refused_not_padded_into_every_row(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"text": "one", "category": "c" * 900_000}) + "\n")
    run = run_contained("accept_command", [TRAINED / "drafter", "--target", TRAINED / "target", "--prompts", prompts],
                        inputs=[TRAINED, prompts], tmp=tmp_path / "run")
    check_contained(run, 1, f"{prompts}:1: 'category' is 900,000 characters, over 128 — shorten it", bounded=True)


def test_labels_that_are_strings_whole_numbers_or_null_are_read() -> None:
    from dflashkit.accept.prompts import load_prompts

    path = Path(__file__).parent / "data" / "labels.jsonl"
    prompts = load_prompts(path)
    assert [(p.id, p.category) for p in prompts] == [("7", "code"), ("labels:2", ""), ("x", "")]


# ---- a GGUF's tensors by their GGUF names ----------------------------------------------------------------------


def test_a_bad_shape_in_a_gguf_is_named_as_the_file_names_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dflashkit.cli import convert_command

    good = tmp_path / "d.gguf"
    assert CliRunner().invoke(convert_command, [str(TRAINED / "drafter"), str(good), "-q"]).exit_code == 0
    bad = hostile.rewrite_gguf(good, tmp_path / "bad.gguf",
                               replace={"blk.0.ffn_up.weight": np.zeros((512, 300), np.float32)})
    message = (f"{bad}: tensor 'blk.0.ffn_up.weight' has shape [512, 300] but the config implies [512, 256] "
               "(config: intermediate_size 512, hidden_size 256)")
    for n, (command, args) in enumerate((("quantize_command", [bad, tmp_path / "q.gguf", "q8_0"]),
                                         ("parity_command", [bad, good]))):
        run = run_contained(command, args, inputs=[bad, good], tmp=tmp_path / f"run{n}")
        check_contained(run, 1, message, bounded=True)
        assert run.lines()[0].endswith(message)


# ---- no raw library warning ------------------------------------------------------------------------------------


def test_the_target_takes_its_cache_by_the_name_its_transformers_gives_it() -> None:
    """transformers 5.24 renamed the forward's ``past_key_values`` to ``cache`` (the old name prints a FutureWarning
    and goes in 6.0): the keyword is read off the model's own signature."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dflashkit.runtime.target import cache_argument

    class Renamed(torch.nn.Module):  # the 5.24 signature
        def forward(self, input_ids: Any = None, cache: Any = None, use_cache: bool = False) -> None:
            return None

    pinned = Qwen3ForCausalLM(Qwen3Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=32))
    assert cache_argument(Renamed(), "C") == {"cache": "C"}
    assert cache_argument(pinned, "C") == {"past_key_values": "C"}


def test_a_librarys_warning_is_one_line_and_its_deprecations_none(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from click.testing import CliRunner

    import dflashkit.inspect as inspect_module
    from dflashkit.cli import inspect_command

    real = inspect_module.inspect_paths

    def noisy(*args: Any, **kwargs: Any) -> Any:
        warnings.warn("`past_key_values` is deprecated", FutureWarning)
        warnings.warn("`x` is deprecated", DeprecationWarning)
        warnings.warn("a note\nwith a second line", UserWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(inspect_module, "inspect_paths", noisy)
    res = CliRunner().invoke(inspect_command, [str(TRAINED / "drafter")])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == ["warning: UserWarning: a note\\nwith a second line"]
    with pytest.warns(FutureWarning, match="past_key_values"):  # --debug: left to Python's own handling
        CliRunner().invoke(inspect_command, [str(TRAINED / "drafter"), "--debug"])



def test_a_gguf_target_without_a_context_length_bounds_by_the_drafters(tmp_path: Path, target_gguf: Path) -> None:
    bare = hostile.rewrite_gguf(target_gguf, tmp_path / "bare.gguf", drop_keys=("qwen3.context_length",))
    run = run_contained("parity_command", [TRAINED / "drafter", TRAINED / "drafter", "--context", "0,64k", "--target",
                                           bare], inputs=[TRAINED, bare], tmp=tmp_path / "run")
    check_contained(run, 2, "--context 64k: 65,536 + 17 of the rounds exceed the drafter's own context of 4,096 (its "
                    "max_position_embeddings / context_length; bare.gguf has no usable context_length) — give levels "
                    "up to 4,079", bounded=True)


def test_the_state_bound_is_the_larger_drafters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate with more layers holds more a position than the reference: the bound is checked on it."""
    import dflashkit.parity.sweep as sweep_module
    from dflashkit.runtime.load import runtime_spec

    small, large = runtime_spec(TRAINED / "drafter"), runtime_spec(LONG / "drafter")
    per_small, per_large = (sweep_module.context_state_bytes(s, 1) for s in (small, large))
    assert per_large > per_small
    monkeypatch.setattr(sweep_module, "MAX_CONTEXT_STATE_BYTES", per_small * 1000)  # the small one would fit
    with pytest.raises(UsageError) as exc:  # 983 + 17 of one round: 1,000 positions
        sweep_module.run_parity_by_context(TRAINED / "drafter", LONG / "drafter", levels=(0, 983))
    assert f"({per_large:,} bytes a position" in str(exc.value)


def test_a_4301_digit_number_in_a_prompts_line_is_named(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "one", "n": ' + "9" * 5000 + "}\n")
    run = run_contained("accept_command", [TRAINED / "drafter", "--target", TRAINED / "target", "--prompts", prompts],
                        inputs=[TRAINED, prompts], tmp=tmp_path / "run")
    check_contained(run, 1, f"{prompts}:1: not valid JSON (Exceeds the limit (4300 digits) for integer string "
                    "conversion", bounded=True)
