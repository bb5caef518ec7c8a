"""The heads rows of the audit (docs/causality.md 1a–1c, `dflashkit.divergences.heads`): where llama.cpp runs a
drafter's logits otherwise than its reference.

Each row: a small checkpoint planted with the field, converted by the CLI (one exact warning, ``--strict`` refuses
and writes nothing), its GGUF run in the runtime by llama.cpp's arithmetic (checked against logits computed here
from the stored weights: the target's ``lm_head``, DSpark's ``markov_w1`` / ``markov_w2``), and ``dflash-parity``
naming the row as the likely cause of the measured gap.

Oracle: llama.cpp's sources — ``src/models/dflash.cpp`` (scale and softcap only for DFlash 2, the Markov bias on the
raw logits) and ``common/speculative.cpp`` (the DFlash path reads slots 1..).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import load_file
from torch.nn import functional as F

from dflashkit.cli import convert_command, parity_command
from dflashkit.divergences import divergences, hf_config
from dflashkit.runtime import DFlashDraftModel, DraftStep, load_drafter, load_target_head
from dflashkit.runtime.load import runtime_spec

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
CTX = 12

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROBS = "probabilities and --spec-draft-p-min thresholds change"
SOFTCAP = ("final_logit_softcapping: the reference caps the logits with tanh at 30; llama.cpp applies the softcap only "
           "for DFlash 2 and runs this DFlash 1 drafter's logits uncapped — greedy argmax is unchanged (tanh is "
           f"monotonic), {PROBS}")
SCALE = ("output_multiplier: the reference scales the logits by 0.5; llama.cpp applies dflash.logit_scale only for "
         "DFlash 2 and runs this DFlash 1 drafter's logits unscaled — greedy argmax is unchanged (a positive "
         f"scale), {PROBS}")
ANCHOR = ("sample_from_anchor: the reference predicts the first draft token at block slot 0 (sample_from_anchor: "
          "true); llama.cpp's DFlash path (no markov_w1.weight) ignores the key and reads slots 1.. — every draft "
          "token shifts by one position and the block drafts one token fewer")
MARKOV = ("output_multiplier / final_logit_softcapping: the reference (as dflashkit runs the checkpoint) scales the "
          "logits by 4 and caps them with tanh at 5 before adding the Markov bias; llama.cpp applies neither for "
          "a Markov-head drafter and adds the bias to the raw logits — the Markov chain's argmax, so the drafts, can differ")


# ---- helpers ------------------------------------------------------------------------------------


def plant(src: Path, out: Path, **edits: Any) -> Path:
    """``src`` copied to ``out`` with its config.json updated by ``edits``."""
    shutil.copytree(src, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **edits}, indent=2))
    return out


def convert(src: Path, out: Path, target: Path, *extra: str) -> Result:
    return CliRunner().invoke(convert_command, [str(src), str(out), "--target", str(target), *extra])


def converted(src: Path, target: Path, *lines: str) -> Path:
    """``src`` converted to the llama.cpp dialect: exit 0 and exactly the warnings ``lines``."""
    out = src.parent / f"{src.name}.gguf"
    res = convert(src, out, target, "--force")
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [f"warning: {src / 'config.json'}: {line} (docs/causality.md)" for line in lines]
    return out


def assert_strict_refuses(src: Path, target: Path, line: str, tmp_path: Path) -> None:
    where = tmp_path / "strict"
    where.mkdir()
    res = convert(src, where / "d.gguf", target, "--strict")
    assert res.exit_code == 1 and not list(where.iterdir())
    assert res.stderr.splitlines() == [f"error: {src / 'config.json'}: {line} — refusing under --strict "
                                       "(docs/causality.md)"]


def parity(src: Path, gguf: Path, target: Path) -> Result:
    return CliRunner().invoke(parity_command, [str(src), str(gguf), "--target", str(target), "--rounds", "2",
                                               "--skip-weights", "--threshold-kl", "1e-6", "--format", "json"])


def draft(model: DFlashDraftModel, target: Path, seed: int = 0) -> DraftStep:
    """One round from random target features, anchor 7."""
    spec = model.spec
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randn(1, CTX, spec.fc_input_width, generator=g)
    ids = torch.tensor([[7] + [spec.mask_token_id] * (spec.block_size - 1)])
    pos = torch.arange(CTX + spec.block_size)[None]
    return model.draft(ctx, ids, pos, model.new_cache(), load_target_head(target))


def target_head(target: Path) -> torch.Tensor:
    """The target's lm_head, read from its safetensors (not through the runtime)."""
    return load_file(str(target / "model.safetensors"))["lm_head.weight"].float()


def softcapped(logits: torch.Tensor, scale: float, cap: float) -> torch.Tensor:
    return torch.tanh(logits * scale / cap) * cap


def test_the_committed_fixtures_have_no_heads_divergence() -> None:
    for d in (TRAINED / "drafter", TRAINED / "drafter-speculators", ROOT / "fixtures" / "trained-long" / "drafter"):
        assert [x for x in divergences(runtime_spec(d), hf_config(d)) if x.rule.id.startswith("heads.")] == []


# ---- a. DFlash 1: output_multiplier and final_logit_softcapping -----------------------------------


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """z-lab DFlash 1 with Gemma's softcap and an output multiplier."""
    return plant(TRAINED / "drafter", tmp_path_factory.mktemp("a") / "drafter", final_logit_softcapping=30.0,
                 output_multiplier=0.5)


def test_dflash1_softcap_and_scale_warn_and_strict_refuses(capped: Path, tmp_path: Path) -> None:
    converted(capped, TARGET, SOFTCAP, SCALE)
    assert_strict_refuses(capped, TARGET, SOFTCAP, tmp_path)


def test_dflash1_gguf_runs_raw_logits_as_llama_cpp(capped: Path) -> None:
    gguf = converted(capped, TARGET, SOFTCAP, SCALE)
    w = target_head(TARGET)
    ours, ref = load_drafter(gguf), load_drafter(capped)
    assert ours.spec.llama_cpp_rules and ours.spec.logit_scale == 0.5 and ours.spec.final_logit_softcapping == 30.0
    a, b = draft(ours, TARGET), draft(ref, TARGET)
    raw = F.linear(a.hidden[:, 1:].float(), w)  # dflash.cpp: the head, nothing after it for DFlash 1
    torch.testing.assert_close(a.logits, raw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.logits, softcapped(F.linear(b.hidden[:, 1:].float(), w), 0.5, 30.0),
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(a.tokens, a.logits.argmax(-1))
    assert (a.logits - b.logits).abs().max() > 1e-3  # the reference's logits are not llama.cpp's


def test_dflash1_parity_names_the_softcap(capped: Path) -> None:
    gguf = converted(capped, TARGET, SOFTCAP, SCALE)
    res = parity(capped, gguf, TARGET)
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert report["status"].startswith("mean KL ") and report["status"].endswith(f"; likely cause: {SOFTCAP}")
    summary = report["summary"]
    assert summary["kl"][0] > 1e-3 and summary["top1"] == 1.0  # argmax unchanged, probabilities not


def test_dflash2_keeps_scale_and_softcap(tmp_path: Path) -> None:
    """llama.cpp scales and caps DFlash 2's logits (its selector reads them): no row, the runtime keeps them."""
    import make_drafters

    src = make_drafters.make_drafter(tmp_path / "d", "dflash2", config_overrides={
        "final_logit_softcapping": 30.0, "output_multiplier": 0.5})
    spec = runtime_spec(src)
    assert spec.final_logit_softcapping == 30.0 and spec.logit_scale == 0.5
    assert [x for x in divergences(spec, hf_config(src)) if x.rule.id.startswith("heads.")] == []
    out = tmp_path / "d.gguf"
    res = CliRunner().invoke(convert_command, [str(src), str(out)])
    assert res.exit_code == 0 and "final_logit_softcapping" not in res.stderr, res.output
    model = load_drafter(out)
    assert model.spec.llama_cpp_rules and model.transforms_logits


# ---- b. speculators DFlash with sample_from_anchor: true ------------------------------------------


@pytest.fixture(scope="module")
def anchored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plant(TRAINED / "drafter-speculators", tmp_path_factory.mktemp("b") / "drafter", sample_from_anchor=True)


def test_speculators_sample_from_anchor_warns_and_strict_refuses(anchored: Path, tmp_path: Path) -> None:
    converted(anchored, TARGET, ANCHOR)
    assert_strict_refuses(anchored, TARGET, ANCHOR, tmp_path)


def test_speculators_sample_from_anchor_gguf_reads_slots_from_1(anchored: Path) -> None:
    gguf = converted(anchored, TARGET, ANCHOR)
    ours, ref = load_drafter(gguf, ggml_activations=False), load_drafter(anchored)  # the slots alone, not rounding
    assert ours.spec.sample_from_anchor and ours.spec.llama_cpp_rules  # the key is written, and not obeyed
    assert (ours.first_draft_slot, ours.draft_tokens) == (1, 15) and (ref.first_draft_slot, ref.draft_tokens) == (0, 16)
    a, b = draft(ours, TARGET), draft(ref, TARGET)
    w = target_head(TARGET)
    # speculative.cpp: draft i is the argmax at block slot i + 1
    raw = F.linear(a.hidden[:, 1:].float(), w)
    torch.testing.assert_close(a.logits, raw, rtol=1e-5, atol=1e-5)
    assert torch.equal(a.tokens, raw.argmax(-1))
    torch.testing.assert_close(b.logits, F.linear(b.hidden.float(), w), rtol=1e-5, atol=1e-5)  # slots 0..
    # the same block hidden states: llama.cpp's draft i is the reference's draft i + 1
    torch.testing.assert_close(a.hidden, b.hidden, rtol=1e-4, atol=1e-4)
    assert torch.equal(a.tokens, b.tokens[:, 1:])


def test_speculators_sample_from_anchor_parity_names_the_shift(anchored: Path) -> None:
    gguf = converted(anchored, TARGET, ANCHOR)
    res = parity(anchored, gguf, TARGET)
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert report["status"].endswith(f"; likely cause: {ANCHOR}")
    assert report["summary"]["top1"] < 1.0


# ---- c. DSpark: the Markov bias on the raw logits -------------------------------------------------


@pytest.fixture(scope="module")
def dspark(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(SpecForge DSpark with an output multiplier and a softcap, its target)."""
    import make_zoo

    root = tmp_path_factory.mktemp("c")
    target = make_zoo.make_target_dir(root)
    src = make_zoo.make_fixture(root / "built", "specforge-dspark", target)
    return plant(src, root / "drafter", output_multiplier=4.0, final_logit_softcapping=5.0), target


def markov_chain(raw: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, anchor: int) -> tuple[torch.Tensor, list[int]]:
    """dflash.cpp build_dspark_markov_head: row k = raw[k] + w2 · w1[prev], prev = the previous row's argmax."""
    rows, tokens, prev = [], [], anchor
    for k in range(raw.shape[0]):
        row = raw[k] + w2 @ w1[prev]
        rows.append(row)
        prev = int(row.argmax())
        tokens.append(prev)
    return torch.stack(rows), tokens


def test_dspark_scale_or_softcap_warns_and_strict_refuses(dspark: tuple[Path, Path], tmp_path: Path) -> None:
    src, target = dspark
    converted(src, target, MARKOV)
    assert_strict_refuses(src, target, MARKOV, tmp_path)
    plain = plant(src, tmp_path / "plain", output_multiplier=1.0, final_logit_softcapping=None)
    assert [x for x in divergences(runtime_spec(plain), hf_config(plain)) if x.rule.id.startswith("heads.")] == []


def test_dspark_gguf_adds_the_bias_to_raw_logits(dspark: tuple[Path, Path]) -> None:
    src, target = dspark
    gguf = converted(src, target, MARKOV)
    ours, ref = load_drafter(gguf), load_drafter(src)
    assert ours.first_draft_slot == 0 and ref.first_draft_slot == 0  # DSpark: llama.cpp honours sample_from_anchor
    stored = load_file(str(src / "model.safetensors"))
    w1, w2 = (stored[f"markov_head.markov_w{i}.weight"].float() for i in (1, 2))
    w = target_head(target)
    a, b = draft(ours, target), draft(ref, target)
    rows, tokens = markov_chain(F.linear(a.hidden[0].float(), w), w1, w2, 7)
    torch.testing.assert_close(a.logits[0], rows, rtol=1e-4, atol=1e-4)
    assert a.tokens[0].tolist() == tokens
    # the checkpoint: the bias after output multiplier and softcap
    rows_ref, tokens_ref = markov_chain(softcapped(F.linear(b.hidden[0].float(), w), 4.0, 5.0), w1, w2, 7)
    torch.testing.assert_close(b.logits[0], rows_ref, rtol=1e-4, atol=1e-4)
    assert b.tokens[0].tolist() == tokens_ref


def test_dspark_parity_names_the_raw_logits(dspark: tuple[Path, Path]) -> None:
    src, target = dspark
    gguf = converted(src, target, MARKOV)
    res = parity(src, gguf, target)
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert report["status"].endswith(f"; likely cause: {MARKOV}")
    assert report["summary"]["kl"][0] > 1e-3
