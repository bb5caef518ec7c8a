"""The EAGLE-3 runtime (``dflashkit/families/eagle3/runtime.py``, llama.cpp's ``eagle3.cpp`` graph) against vLLM
``speculators`` 0.9.0's own ``Eagle3DraftModel``.

The fixtures are written by speculators' classes (``fixtures/make_eagle3.py``); the reference is loaded back FROM
THAT DIRECTORY by ``Eagle3DraftModel.from_pretrained(path, config=cfg)``, where ``cfg`` is
``Eagle3SpeculatorConfig.from_pretrained(path)`` with ``transformer_layer_config._attn_implementation = "eager"``
(the class otherwise picks flex attention; eager runs on CPU with a dense causal float mask). Its verifier is the
fixture's local target directory, so nothing is downloaded; the checkpoint's own ``embed_tokens``/``lm_head`` win
over the verifier's (speculators loads the verifier's only over NaN weights).

Ours: the checkpoint through dflashkit's loader (`load_drafter`: the family's tensor map, q/k permuted as llama.cpp's
converter permutes them and roped in ggml's NORM mode), float32.

The reference logits are speculators' training forward itself — ``model(hidden_states=features [1, T, 3H],
input_ids [1, T], document_ids=zeros, position_ids=arange(T)[None], ttt_steps=1)`` — read off its ``lm_head`` by a
forward hook (the forward returns only the argmax tokens): with one TTT step that is one draft step over T rows
with a causal mask, i.e. llama.cpp's decoder on rows (token_t, g_t) at positions 0…T−1. speculators' own default
positions (``1 + arange``, docs/design/eagle3.md §4.2 item 6) are compared too: RoPE is relative.

Equality: draft-vocabulary logits within 1e-5 absolute, float32 (the bf16 fixture: both sides cast to float32).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from dflashkit.errors import DFlashError
from dflashkit.families.eagle3.runtime import Eagle3DraftModel, KVCache
from dflashkit.runtime import HFTarget, load_drafter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_eagle3  # noqa: E402

pytest.importorskip("speculators.models.eagle3")
warnings.filterwarnings("ignore", module="transformers")

ATOL = 1e-5
T = 9
SPECULATORS = ("speculators-llama", "speculators-full-vocab", "speculators-norm-before-fc", "speculators-bf16")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    return make_eagle3.make(tmp_path_factory.mktemp("eagle3-runtime"), [*SPECULATORS, "vllm-layers0"])


def _reference(path: Path) -> Any:
    from speculators.models.eagle3 import Eagle3DraftModel as SpeculatorsEagle3, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(path))
    config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
    return SpeculatorsEagle3.from_pretrained(str(path), config=config).float().eval()


def _inputs(width: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, T, width, generator=gen), torch.randint(0, vocab, (1, T), generator=gen)


def _reference_step0(model: Any, features: torch.Tensor, ids: torch.Tensor,
                     positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(step-0 draft-vocabulary logits [1, T, Vd], speculators' own step-0 draft tokens [1, T])."""
    captured: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()))
    try:
        with torch.no_grad():
            tokens = model(hidden_states=features, input_ids=ids, document_ids=torch.zeros_like(ids),
                           position_ids=positions, ttt_steps=1)
    finally:
        hook.remove()
    assert len(captured) == 1
    return captured[0], tokens[0]


def _ours(model: Eagle3DraftModel, features: torch.Tensor, ids: torch.Tensor, head: Any = None) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model.step(ids, model.encode(features), torch.arange(ids.shape[1]), KVCache(), head)


def _vocab(model: Eagle3DraftModel) -> int:
    return int(model.spec.vocab_size)


def _draft_rows(model: Eagle3DraftModel) -> int:
    return int(model.spec.draft_vocab_size or model.spec.vocab_size)


@pytest.mark.parametrize("name", SPECULATORS)
def test_step0_logits_match_speculators_forward(name: str, made: tuple[Path, dict[str, Path]]) -> None:
    path = made[1][name]
    reference, ours = _reference(path), load_drafter(path)
    features, ids = _inputs(ours.fc.in_features, _vocab(ours))
    _, draft, prenorm = _ours(ours, features, ids)
    assert draft.shape == (1, T, _draft_rows(ours)) and prenorm.shape == (1, T, ours.spec.hidden_size)
    for positions in (torch.arange(T)[None], None):  # ours at 0…T−1; speculators at the same, then at 1…T
        logits, tokens = _reference_step0(reference, features, ids, positions)
        assert logits.shape == draft.shape
        diff = (logits - draft).abs().max().item()
        assert diff <= ATOL, (name, positions is None, diff)
        assert torch.equal(tokens, draft.argmax(-1)), name


@pytest.mark.parametrize("name", SPECULATORS)
def test_draft_argmax_through_d2t_is_the_target_vocabulary_argmax(name: str,
                                                                  made: tuple[Path, dict[str, Path]]) -> None:
    ours = load_drafter(made[1][name])
    features, ids = _inputs(ours.fc.in_features, _vocab(ours), seed=1)
    target, draft, _ = _ours(ours, features, ids)
    assert target.shape == (1, T, 512)
    mapped = draft.argmax(-1) if ours.d2t is None else ours.d2t[draft.argmax(-1)]
    assert torch.equal(mapped, target.argmax(-1))
    finite = torch.isfinite(target)
    assert int(finite[0, 0].sum()) == _draft_rows(ours)  # −inf outside the d2t rows (llama.cpp's ggml_fill)
    if ours.d2t is None:
        assert name == "speculators-full-vocab" and torch.equal(target, draft)
    else:
        assert torch.equal(target[..., ours.d2t], draft)
        assert torch.equal(finite[0, 0].nonzero().flatten(), ours.d2t.sort().values)


def test_one_row_at_a_time_through_the_cache_equals_one_batch(made: tuple[Path, dict[str, Path]]) -> None:
    """llama.cpp decodes a batch and single rows through one KV cache alike; dropping rows from a position on and
    decoding them again (``draft()``'s ``seq_rm``) gives the same rows."""
    ours = load_drafter(made[1]["speculators-norm-before-fc"])
    features, ids = _inputs(ours.fc.in_features, _vocab(ours), seed=2)
    _, batch, batch_h = _ours(ours, features, ids)
    cache, g = KVCache(), ours.encode(features)
    with torch.no_grad():
        rows = [ours.step(ids[:, i:i + 1], g[:, i:i + 1], torch.tensor([i]), cache) for i in range(T)]
        assert len(cache) == T
        assert (torch.cat([r[1] for r in rows], 1) - batch).abs().max().item() <= ATOL
        assert (torch.cat([r[2] for r in rows], 1) - batch_h).abs().max().item() <= ATOL
        cache.remove_from(5)
        assert len(cache) == 5
        _, again, _ = ours.step(ids[:, 5:], g[:, 5:], torch.arange(5, T), cache)
        assert (again - batch[:, 5:]).abs().max().item() <= ATOL
        cache.crop(3)
        assert cache.positions.tolist() == [0, 1, 2] and cache.k is not None and cache.k.shape[2] == 3


def test_a_round_drafts_as_the_chain_does_and_replaces_its_rows(made: tuple[Path, dict[str, Path]]) -> None:
    """`draft`: the context rows (token p + 1, g_p) at p — the last one the seed — then each drafted token with the
    previous step's pre-norm state; a second round from the same position drops the first one's rows."""
    ours = load_drafter(made[1]["speculators-llama"])
    features, ids = _inputs(ours.fc.in_features, _vocab(ours), seed=3)
    cache = ours.new_cache()
    noise = torch.zeros(1, 4, dtype=torch.long)
    noise[0, 0] = ids[0, -1]
    step = ours.draft(features, noise, torch.arange(T + 3)[None], cache, context_ids=ids)
    assert step.tokens.shape == (1, 3) and len(cache) == T + 2  # the context rows and the first two drafts
    with torch.no_grad():  # the chain by hand: seed row, then (d_i, h_i) at T − 1 + i
        manual, g = KVCache(), ours.encode(features)
        logits, _, h = ours.step(ids, g, torch.arange(T), manual)
        tokens = [int(logits[0, -1].argmax())]
        for i in (1, 2):
            logits, _, h = ours.step(torch.tensor([[tokens[-1]]]), h[:, -1:], torch.tensor([T - 1 + i]), manual)
            tokens.append(int(logits[0, -1].argmax()))
    assert step.tokens[0].tolist() == tokens and all(t in set(ours.d2t.tolist()) for t in tokens)
    again = ours.draft(features, noise, torch.arange(T + 3)[None], cache, context_ids=ids)
    assert torch.equal(again.tokens, step.tokens) and len(cache) == T + 2


def test_a_drafter_without_embeddings_takes_the_targets(made: tuple[Path, dict[str, Path]]) -> None:
    target, fixtures = made
    ours = load_drafter(fixtures["vllm-layers0"])  # vLLM's flat layout: no embed_tokens of its own
    assert ours.embed_tokens is None
    features, ids = _inputs(ours.fc.in_features, _vocab(ours), seed=4)
    with pytest.raises(DFlashError, match="reads the target's: pass the target head"):
        _ours(ours, features, ids)
    head = HFTarget(target).head()
    logits, draft, _ = _ours(ours, features, ids, head)
    assert logits.shape == (1, T, 512) and draft.shape == (1, T, 256) and torch.isfinite(draft).all()


@pytest.fixture(scope="module")
def parity_files(made: tuple[Path, dict[str, Path]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import numpy as np

    from dflashkit.converters.convert import convert
    from hostile import rewrite_gguf

    target, fixtures = made
    out = tmp_path_factory.mktemp("eagle3-parity")
    f32 = convert(fixtures["speculators-llama"], out / "f32.gguf", outtype="f32", target=target, progress=False,
                  warn=lambda _: None).out
    import gguf

    fc = next(t for t in gguf.GGUFReader(f32).tensors if t.name == "fc.weight").data
    zeroed = rewrite_gguf(f32, out / "zeroed-fc.gguf", replace={"fc.weight": np.zeros_like(fc)})
    return {"f32": f32, "zeroed": zeroed}


def test_parity_of_the_checkpoint_and_its_gguf(made: tuple[Path, dict[str, Path]],
                                               parity_files: dict[str, Path]) -> None:
    """dflash-parity runs both through the chain (the head each step, as llama.cpp does): the F32 file is the
    checkpoint; a file whose fc was zeroed drafts blind and fails the default gate."""
    from dflashkit.parity.run import run_parity

    target, fixtures = made
    same = run_parity(fixtures["speculators-llama"], parity_files["f32"], target=target, rounds=3)
    assert same.overall is not None and same.overall.top1 == 1.0 and same.overall.kl_mean < 1e-9
    assert same.exit_code(default_gate=True) == 0
    assert [r.reference_tokens == r.candidate_tokens for r in same.rounds] == [True, True, True]
    blind = run_parity(fixtures["speculators-llama"], parity_files["zeroed"], target=target, rounds=3)
    assert blind.exit_code(default_gate=True) == 1
    assert any(f.startswith("top-1 agreement") for f in blind.failures(default_gate=True)), blind.failures(
        default_gate=True)
