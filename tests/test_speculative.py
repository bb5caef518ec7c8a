"""Speculative decoding primitives: accept_prefix, rejection sampling, and the draft–verify loop.

The loop's contract: at temperature 0 its output is exactly the target's own greedy output, whatever
the drafter proposes (random fixture drafters, and an oracle that is right for a chosen prefix); at
temperature > 0 it follows z-lab's ``dflash_generate`` token for token with the same seed.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from conftest import FAMILIES
from dflashkit.errors import UsageError
from dflashkit.runtime import HFTarget, load_drafter
from dflashkit.runtime.speculative import (
    Acceptance,
    accept_prefix,
    rejection_sample,
    speculative_generate,
)

import make_drafters

PROMPT = "Write a haiku about the sea."
NEW_TOKENS = 20


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def hf_targets(targets: dict[int, dict[str, Any]]) -> dict[int, HFTarget]:
    return {hidden: HFTarget(t["hf"]) for hidden, t in targets.items()}


def _target_for(family: str, hf_targets: dict[int, HFTarget]) -> HFTarget:
    return hf_targets[make_drafters.FAMILIES[family]["hidden_size"]]


def plain_greedy(target: HFTarget, ids: list[int], n: int) -> list[int]:
    """Greedy decoding the slow, obviously-right way: the whole sequence through the model each step."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(torch.argmax(target.model(torch.tensor([seq])).logits[0, -1])))
    return seq[len(ids):]


# ---------------------------------------------------------------------------------------------
# accept_prefix
# ---------------------------------------------------------------------------------------------


def test_accept_prefix_full_match_takes_the_bonus_after_the_last_token() -> None:
    acc = accept_prefix([5, 6, 7], [5, 6, 7, 9])
    assert acc == Acceptance(3, [5, 6, 7, 9])
    assert acc.bonus == 9


def test_accept_prefix_first_token_reject_commits_only_the_correction() -> None:
    assert accept_prefix([5, 6, 7], [4, 6, 7, 9]) == Acceptance(0, [4])


def test_accept_prefix_stops_at_the_first_mismatch() -> None:
    # position 2 matches again, but acceptance is a prefix: it stops at position 1
    assert accept_prefix([5, 6, 7, 8], [5, 1, 7, 8, 2]) == Acceptance(1, [5, 1])


def test_accept_prefix_empty_draft_is_the_bonus_alone() -> None:
    assert accept_prefix([], [3]) == Acceptance(0, [3])


@pytest.mark.parametrize("draft, verify", [([1, 2], [1, 2]), ([1, 2], [1, 2, 3, 4]), ([], []), ([1], [])])
def test_accept_prefix_length_errors(draft: list[int], verify: list[int]) -> None:
    with pytest.raises(ValueError, match=r"len\(draft\) \+ 1"):
        accept_prefix(draft, verify)


@pytest.mark.parametrize("draft, verify", [([1.0], [1, 2]), ([1], [1, True]), ("ab", [1, 2, 3]), ([1], 7)])
def test_accept_prefix_rejects_non_token_ids(draft: Any, verify: Any) -> None:
    with pytest.raises(TypeError):
        accept_prefix(draft, verify)


def test_accept_prefix_takes_numpy_and_torch_integers() -> None:
    acc = accept_prefix(np.array([5, 6], dtype=np.int64), torch.tensor([5, 2, 9]))
    assert acc == Acceptance(1, [5, 2]) and all(type(t) is int for t in acc.tokens)


# ---------------------------------------------------------------------------------------------
# rejection_sample
# ---------------------------------------------------------------------------------------------


def _first_committed(p: torch.Tensor, q: torch.Tensor, indices: torch.Tensor | None, n: int) -> np.ndarray:
    """Distribution of the first committed token when one token is drafted from q and verified against p."""
    counts = np.zeros(p.shape[-1])
    for _ in range(n):
        if indices is None:
            tok = torch.multinomial(q, 1)
        else:
            tok = indices[torch.multinomial(q, 1)]
        acc, bonus = rejection_sample(tok, torch.stack([p, p]), q[None], None if indices is None else indices[None])
        counts[int(tok) if acc else bonus] += 1
    return counts / n


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # a bad draft distribution
    freq = _first_committed(p, q, None, 4000)
    assert np.abs(freq - p.numpy()).max() < 0.03  # ~4σ at n = 4000


def test_rejection_sampling_over_top_k_candidates_keeps_the_target_distribution() -> None:
    """DFlash 2 samples among its top-k candidates: q lives on `indices`, zero elsewhere."""
    torch.manual_seed(1)
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    indices, q = torch.tensor([3, 0]), torch.tensor([0.7, 0.3])
    freq = _first_committed(p, q, indices, 4000)
    assert np.abs(freq - p.numpy()).max() < 0.03


def test_rejection_sampling_accepts_everything_when_draft_equals_target() -> None:
    torch.manual_seed(2)
    p = torch.softmax(torch.randn(4, 8), -1)
    for _ in range(20):
        draft = torch.multinomial(p[:3], 1)[:, 0]
        assert rejection_sample(draft, p, p[:3])[0] == 3


def test_rejection_sampling_never_keeps_a_token_the_target_rules_out() -> None:
    torch.manual_seed(3)
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    for _ in range(50):
        acc, bonus = rejection_sample(torch.tensor([0]), p, q)
        assert acc == 0 and bonus in (1, 2)


def test_rejection_sample_checks_shapes() -> None:
    with pytest.raises(ValueError, match="2 draft tokens need 3 target"):
        rejection_sample(torch.tensor([0, 1]), torch.ones(2, 4) / 4, torch.ones(2, 4) / 4)


# ---------------------------------------------------------------------------------------------
# The loop at temperature 0: exactly the target's greedy output
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_loop_equals_the_targets_generate(family: str, drafters: dict[str, Any], hf_targets: dict) -> None:
    target = _target_for(family, hf_targets)
    model = load_drafter(drafters[family])
    ids = target.encode(PROMPT)
    result = speculative_generate(model, target, ids, max_new_tokens=NEW_TOKENS)
    with torch.inference_mode():
        expected = target.model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert result.output_ids == expected[0, len(ids):].tolist()
    assert result.prompt_ids == ids
    # accounting: the prefill makes the first token, each round commits accepted + 1
    assert len(result.output_ids) == 1 + sum(a + 1 for a in result.accepted)
    assert len(result.drafted) == result.rounds and all(0 <= a <= d for a, d in zip(result.accepted, result.drafted))


@pytest.mark.parametrize("family", ["qwen3-b16", "qwen35-swa", "optional"])
def test_greedy_loop_with_an_oracle_drafter_accepts_what_is_right_and_stays_exact(
    family: str, drafters: dict[str, Any], hf_targets: dict
) -> None:
    """Random drafters are rejected at once; an oracle right for the first j tokens of each block
    exercises multi-token acceptance, full blocks, and both caches' cropping."""
    target = _target_for(family, hf_targets)
    model = load_drafter(drafters[family])
    block = model.block_size
    ids = target.encode(PROMPT)
    n = 3 * block
    truth = ids + plain_greedy(target, ids, n + block)
    plan = [0, 3, block - 1, 1, block - 1, 2, 5, 0, block - 1]  # right tokens per round
    real_draft = model.draft
    calls: list[int] = []

    def oracle(target_hidden: torch.Tensor, block_ids: torch.Tensor, position_ids: torch.Tensor, *args: Any,
               **kwargs: Any) -> Any:
        step = real_draft(target_hidden, block_ids, position_ids, *args, **kwargs)
        verify = block_ids.shape[1]
        start = int(position_ids[0, -verify])
        assert block_ids[0, 0] == truth[start]  # the anchor is the last committed token
        right = min(plan[len(calls) % len(plan)], verify - 1)
        calls.append(right)
        want = truth[start + 1 : start + verify]
        step.tokens = torch.tensor([want[:right] + [(t + 1) % 512 for t in want[right:]]])
        return step

    model.draft = oracle  # type: ignore[method-assign]
    result = speculative_generate(model, target, ids, max_new_tokens=n, stop_token_ids=())
    assert result.output_ids == truth[len(ids) : len(ids) + n]
    assert result.accepted[:-1] == calls[:-1]  # the last round may be cut at max_new_tokens
    assert result.accepted[-1] <= calls[-1]
    assert len(result.output_ids) == n == 1 + sum(a + 1 for a in result.accepted)
    assert result.tau > 2


def test_stop_token_ends_the_output_and_is_kept(drafters: dict[str, Any], hf_targets: dict) -> None:
    target = hf_targets[64]
    model = load_drafter(drafters["qwen3-b16"])
    ids = target.encode(PROMPT)
    free = speculative_generate(model, target, ids, max_new_tokens=NEW_TOKENS, stop_token_ids=())
    stop = free.output_ids[5]
    first = free.output_ids.index(stop)
    stopped = speculative_generate(model, target, ids, max_new_tokens=NEW_TOKENS, stop_token_ids=[stop])
    assert stopped.output_ids == free.output_ids[: first + 1]
    assert stopped.stopped and not free.stopped
    assert len(stopped.output_ids) == 1 + sum(a + 1 for a in stopped.accepted)


def test_the_output_never_exceeds_max_new_tokens(drafters: dict[str, Any], hf_targets: dict) -> None:
    target = hf_targets[64]
    model = load_drafter(drafters["qwen3-b16"])
    ids = target.encode(PROMPT)
    for n in (1, 2, 3):
        r = speculative_generate(model, target, ids, max_new_tokens=n, temperature=1.0, seed=0, stop_token_ids=())
        assert len(r.output_ids) == n


# ---------------------------------------------------------------------------------------------
# The loop at temperature > 0
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3-b16", "dflash2"])
def test_sampling_follows_zlab_dflash_generate_with_the_same_seed(
    family: str, drafters: dict[str, Any], hf_targets: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same seed, same random draws in the same order: the same tokens and acceptance lengths."""
    zlab = pytest.importorskip("dflash.model")
    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)  # its stats timer assumes CUDA
    cls = zlab.DFlash2DraftModel if family == "dflash2" else zlab.DFlashDraftModel
    reference = cls.from_pretrained(drafters[family], dtype=torch.float32).eval()
    target = hf_targets[64]
    model = load_drafter(drafters[family])
    ids = target.encode(PROMPT)
    stops = [458, 456]
    for temperature in (0.7, 1.3):
        torch.manual_seed(5)
        ref = zlab.dflash_generate(reference, target.model, torch.tensor([ids]), NEW_TOKENS, stops,
                                   temperature=temperature, return_stats=True)
        ours = speculative_generate(model, target, ids, max_new_tokens=NEW_TOKENS, temperature=temperature, seed=5,
                                    stop_token_ids=stops)
        assert ours.output_ids == ref.output_ids[0, len(ids):].tolist()
        assert [a + 1 for a in ours.accepted] == ref.acceptance_lengths


def test_sampling_is_seeded_and_leaves_the_callers_rng_alone(drafters: dict[str, Any], hf_targets: dict) -> None:
    target = hf_targets[64]
    model = load_drafter(drafters["qwen3-b16"])
    ids = target.encode(PROMPT)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = speculative_generate(model, target, ids, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    b = speculative_generate(model, target, ids, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=7)
    assert (a.output_ids, a.accepted) == (b.output_ids, b.accepted)
    assert a.temperature == 1.0 and a.to_trace("d")["temperature"] == 1.0


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_wrong_target_is_a_one_line_usage_error(drafters: dict[str, Any], hf_targets: dict) -> None:
    model = load_drafter(drafters["gemma4"])  # 72 wide, taps layer 9
    with pytest.raises(UsageError, match="hidden_size 72 .* wrong target"):
        speculative_generate(model, hf_targets[64], [1, 2, 3], max_new_tokens=4)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
    ({"max_new_tokens": 4, "temperature": -1.0}, "temperature must be"),
])
def test_bad_arguments(kwargs: dict, message: str, drafters: dict[str, Any], hf_targets: dict) -> None:
    model = load_drafter(drafters["qwen3-b16"])
    with pytest.raises(UsageError, match=message):
        speculative_generate(model, hf_targets[64], [1, 2, 3], **kwargs)
    with pytest.raises(UsageError, match="no tokens"):
        speculative_generate(model, hf_targets[64], [], max_new_tokens=4)


@pytest.mark.parametrize("cut", ["max_new_tokens", "stop_token"])
def test_a_round_cut_short_counts_only_the_positions_it_kept(
    cut: str, drafters: dict[str, Any], hf_targets: dict
) -> None:
    """An oracle drafter right on every position: each round accepts all it judged, so every per-position
    acceptance rate of dflash-accept is exactly 1. The third round is cut after k of its 16 tokens (by
    max_new_tokens, or by a stop token first seen there): by hand, drafted = accepted = [15, 15, k - 1];
    counting that round as fully drafted would make positions k..15 look rejected once (rate 2/3)."""
    from dflashkit.accept import DrafterRun

    target = hf_targets[64]
    model = load_drafter(drafters["qwen3-b16"])
    block = model.block_size
    assert block == 16
    ids = target.encode(PROMPT)
    truth = ids + plain_greedy(target, ids, 4 * block)
    real_draft = model.draft

    def oracle(target_hidden: torch.Tensor, block_ids: torch.Tensor, position_ids: torch.Tensor, *args: Any,
               **kwargs: Any) -> Any:
        step = real_draft(target_hidden, block_ids, position_ids, *args, **kwargs)
        verify = block_ids.shape[1]
        start = int(position_ids[0, -verify])
        step.tokens = torch.tensor([truth[start + 1 : start + verify]])
        return step

    model.draft = oracle  # type: ignore[method-assign]
    out = truth[len(ids):]
    # out[0] comes from the prefill, rounds 1 and 2 commit out[1:17] and out[17:33], round 3 starts at out[33]
    if cut == "max_new_tokens":
        k = 5
        result = speculative_generate(model, target, ids, max_new_tokens=33 + k, stop_token_ids=())
    else:
        first_seen = [i for i in range(34, 33 + block - 1) if out[i] not in out[:i]]
        assert first_seen, "the tiny target's greedy output has no new token in round 3"
        k = first_seen[0] - 32
        result = speculative_generate(model, target, ids, max_new_tokens=4 * block, stop_token_ids=[out[k + 32]])
        assert result.stopped
    assert result.output_ids == out[: 33 + k]
    assert result.accepted == [15, 15, k - 1]
    assert result.drafted == [15, 15, k - 1]
    run = DrafterRun(path="oracle", info=None, block_size=block, runs=[result])  # type: ignore[arg-type]
    assert run.position_rates() == [1.0] * (block - 1)
