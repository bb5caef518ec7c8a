"""DSpark: what it adds to the DFlash drafter (`dflash.py`) — a Markov head and a confidence head.

Specification: vLLM ``speculators`` 0.9.0 ``speculators/models/dspark/`` (``DSparkDraftModel.forward``,
``MarkovHead``, ``ConfidenceHead``) for the maths, and llama.cpp's ``build_dspark_markov_head``
(``src/models/dflash.cpp``) for how it runs at inference:

- the DFlash backbone gives the block's hidden states and base logits (own ``lm_head`` of the draft
  vocabulary when ``draft_vocab_size`` < the target's, rows mapped to target ids by ``d2t``);
- slot by slot, from the first predicting slot (0 with ``sample_from_anchor``, else 1), the Markov head
  adds a low-rank bias ``markov_w2 · markov_w1[prev]`` to the slot's logits, where ``prev`` is the
  *target* id chosen at the previous slot (the anchor for the first slot) — training feeds the true
  previous tokens, inference the drafted ones; only ``markov_head_type: vanilla`` exists at inference;
- a llama.cpp GGUF (``llama_cpp_rules``) adds the bias to the raw logits, as llama.cpp does (it applies no output
  multiplier or softcap for DSpark); a checkpoint adds it after them (`DFlashDraftModel.compute_logits`);
- the confidence head scores each slot: ``sigmoid(conf_proj · [hidden; markov_w1[prev]] + b)``, the
  predicted probability that the slot's token is accepted (reported, not used for drafting).

At temperature > 0 the chain conditions on the sampled token (so the draft distribution handed to
rejection sampling is the one each token was drawn from); llama.cpp's in-graph chain is greedy.
"""

from __future__ import annotations

import torch
from torch import nn

from ...spec import DrafterSpec
from ...runtime.dflash import DFlashDraftModel, DraftStep, Embedding, Linear, TargetHead, sample_probs, sampling_probs


class MarkovHead(nn.Module):
    """``bias(prev) = markov_w2(markov_w1[prev])``: [target vocab, rank] lookup, [draft vocab, rank] projection."""

    def __init__(self, rank: int, draft_vocab: int) -> None:
        super().__init__()
        self.markov_w1 = Embedding()
        self.markov_w2 = Linear(rank, draft_vocab)
        self.register_buffer("markov_w2_scale", None)  # llama.cpp's optional `markov_w2.scale`

    def prev_embeddings(self, prev_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(prev_ids)

    def bias(self, prev_emb: torch.Tensor) -> torch.Tensor:
        out = self.markov_w2(prev_emb.to(self.markov_w1.weight.dtype))
        return out if self.markov_w2_scale is None else out * self.markov_w2_scale


class ConfidenceHead(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """The confidence *logit* per slot (sigmoid gives the acceptance probability)."""
        return self.proj(features).squeeze(-1)


class DSparkDraftModel(DFlashDraftModel):
    """DFlash backbone + Markov logit bias chained through the block + per-slot confidence."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__(spec)
        rank = int(getattr(spec, "markov_rank", 0) or 0)
        draft_vocab = getattr(spec, "draft_vocab_size", None) or spec.vocab_size or 0
        self.markov_head = MarkovHead(rank, draft_vocab) if rank > 0 else None
        self.with_markov = bool(getattr(spec, "confidence_head_with_markov", True)) and rank > 0
        self.confidence_head = (ConfidenceHead(spec.hidden_size + (rank if self.with_markov else 0))
                                if spec.has_confidence_head else None)

    def head_step(self, hidden: torch.Tensor, draft_hidden: torch.Tensor, anchor_ids: torch.Tensor,
                  head: TargetHead, temperature: float) -> DraftStep:
        # [b, n, draft vocab]; a llama.cpp GGUF: the raw logits, as llama.cpp adds the bias (`transforms_logits`)
        base = self.compute_logits(draft_hidden, head)
        prev = anchor_ids
        rows, logits_out, tokens, confidence = [], [], [], []
        for k in range(draft_hidden.shape[1]):
            prev_emb = self.markov_head.prev_embeddings(prev) if self.markov_head is not None else None
            row = base[:, k] if prev_emb is None else base[:, k] + self.markov_head.bias(prev_emb)  # type: ignore[union-attr]
            target_row = self.to_target_vocab(row, head.vocab_size)
            if temperature > 0:
                token = sample_probs(sampling_probs(target_row, temperature))
            else:
                token = torch.argmax(target_row, dim=-1)
            if self.confidence_head is not None:
                h = draft_hidden[:, k]
                feats = torch.cat([h, prev_emb.to(h.dtype)], dim=-1) if self.with_markov else h  # type: ignore[union-attr]
                confidence.append(torch.sigmoid(self.confidence_head(feats).float()))
            rows.append(row)
            logits_out.append(target_row)
            tokens.append(token)
            prev = token
        draft_logits = torch.stack(rows, dim=1)
        return DraftStep(hidden, torch.stack(logits_out, dim=1), torch.stack(tokens, dim=1), draft_logits,
                         torch.stack(confidence, dim=1) if confidence else None)
