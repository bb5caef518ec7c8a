"""DFlash 2: what it adds to the DFlash drafter (`dflash.py`).

Specification: z-lab's ``DFlash2DraftModel`` (``dflash/model.py``):

- a *grouped dynamic causal convolution* around each attention block and each MLP block: before
  the block, the normed input is convolved along the block's positions with ``base_kernel[0]`` plus a
  per-position kernel projected from the input itself; after the block, its output is convolved with
  ``base_kernel[1]`` plus the second half of that projected kernel. Channels share kernels in groups
  of ``conv_group_size``; the convolution is causal (position t mixes t, t-1, ..., t-k+1);
- a *candidate selector* that picks the draft path among each position's top-k logits with a
  low-rank pairwise score between the previous token and each candidate (``propose``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ...spec import DrafterSpec
from ...runtime.dflash import DecoderLayer, DFlashDraftModel, Embedding, Linear, TargetHead, sample_probs, sampling_probs


def grouped_dynamic_convolve(
    hidden: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``out[t] = Σ_o (base[o] + dynamic[t, o]) · hidden[t - o]`` per channel group (zero before t = 0).

    ``hidden`` [b, len, hidden], ``dynamic`` [b, len, k, groups], ``base`` [k, hidden].
    """
    batch, length, size = hidden.shape
    groups = size // group_size
    blocks = hidden.view(batch, length, groups, group_size)
    dynamic = dynamic.view(batch, length, base.shape[0], groups, 1)
    out = torch.zeros_like(blocks)
    for offset in range(base.shape[0]):
        # hidden shifted `offset` positions later along the sequence (causal), zero-filled
        values = blocks if offset == 0 else F.pad(blocks[:, :-offset], (0, 0, 0, 0, offset, 0))
        kernel = base[offset].view(1, 1, groups, group_size).to(hidden.dtype)
        out = out + kernel * values
        out = torch.addcmul(out, dynamic[:, :, offset], values)
    return out.view_as(hidden)


class GroupedDynamicCausalConv(nn.Module):
    def __init__(self, hidden_size: int, kernel_size: int, group_size: int) -> None:
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        self.register_buffer("base_kernel", None)  # [2, kernel_size, hidden]: before / after
        self.kernel_projection = Linear(hidden_size, 2 * kernel_size * self.groups)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Convolve the block's input; returns it and the dynamic kernel kept for `finish`."""
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        before = grouped_dynamic_convolve(x, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size)
        return before, dynamic[..., 1, :, :]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return grouped_dynamic_convolve(x, dynamic, self.base_kernel[1], self.group_size)


class DFlash2DecoderLayer(DecoderLayer):
    def __init__(self, spec: DrafterSpec, layer: int) -> None:
        super().__init__(spec, layer)
        k, g = int(spec.conv_kernel_size or 0), int(spec.conv_group_size or 0)
        self.attention_conv = GroupedDynamicCausalConv(spec.hidden_size, k, g)
        self.mlp_conv = GroupedDynamicCausalConv(spec.hidden_size, k, g)

    def around(self, block: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        conv = self.attention_conv if block == "attention" else self.mlp_conv
        x, kernel = conv.prepare(x)
        return conv.finish(fn(x), kernel)


class CandidateSelector(nn.Module):
    """Chooses each draft position's token among its top-k logits, left to right.

    score(candidate) = logit + ⟨predecessor_codebook[previous token] ⊙ hidden_projection(h_t),
    successor_codebook[candidate]⟩, the previous token starting at the anchor.
    """

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.top_k = int(spec.selector_top_k or 0)
        self.predecessor_codebook = Embedding()
        self.successor_codebook = Embedding()
        self.hidden_projection = Linear(spec.hidden_size, int(spec.selector_rank or 0))

    def select(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, temperature: float = 0.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """→ (path [b, n], candidates [b, n, top_k], per-position candidate probabilities or None)."""
        unary, candidates = torch.topk(logits, self.top_k, dim=-1, sorted=False)
        hidden = self.hidden_projection(hidden)
        previous = anchor_ids
        path, q_rows = [], []
        for t in range(hidden.shape[1]):
            scores = unary[:, t] + torch.einsum(
                "br,bkr->bk",
                self.predecessor_codebook(previous) * hidden[:, t],
                self.successor_codebook(candidates[:, t]),
            )
            if temperature > 0:
                q = sampling_probs(scores, temperature)
                index = sample_probs(q)
                q_rows.append(q)
            else:
                index = torch.argmax(scores, dim=-1)
            previous = candidates[:, t].gather(-1, index[:, None])[:, 0]
            path.append(previous)
        return torch.stack(path, dim=1), candidates, torch.stack(q_rows, dim=1) if q_rows else None


class DFlash2DraftModel(DFlashDraftModel):
    """z-lab's ``DFlash2DraftModel``: DFlash with dynamic convolutions and a candidate selector."""

    layer_class = DFlash2DecoderLayer
    proposes_with_selector = True

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__(spec)
        self.candidate_selector = CandidateSelector(spec)

    def select_tokens(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, temperature: float = 0.0
    ) -> torch.Tensor:
        return self.candidate_selector.select(hidden, logits, anchor_ids, temperature)[0]

    def propose(
        self, hidden: torch.Tensor, anchor_ids: torch.Tensor, head: TargetHead | nn.Module, temperature: float = 0.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The reference's ``propose``: draft tokens, candidates and probabilities for positions 1.."""
        return self.candidate_selector.select(hidden, self.compute_logits(hidden, head), anchor_ids, temperature)
