"""The DFlash drafter forward, in plain PyTorch — a readable re-implementation of z-lab's reference.

Specification: ``dflash/model.py`` of the ``dflash`` package on PyPI (``DFlashDraftModel``,
``dflash_generate``). One round of drafting:

1. the target's hidden states at the tap layers, concatenated, go through ``fc`` → ``hidden_norm``:
   the *context* stream;
2. the block ``[anchor, mask, mask, ...]`` is embedded with the target's ``embed_tokens`` × the
   input embedding scale: the *noise* stream; positions continue the context's;
3. each layer attends with queries from the noise stream only and keys/values from context and
   noise concatenated (``q_norm`` / ``k_norm`` per head, RoPE, GQA); full-attention layers are
   non-causal, ``sliding_attention`` layers causal with a window (``is_causal`` overrides);
   then a SwiGLU MLP; the final ``norm`` closes the stack;
4. logits = target ``lm_head`` × output multiplier, then ``tanh`` softcapping when configured (a llama.cpp GGUF:
   only for DFlash 2, as llama.cpp — `DFlashDraftModel.transforms_logits`).

Module and tensor names mirror the HF checkpoint (``layers.0.self_attn.q_proj.weight``), so the
canonical ids of `dflashkit.drafters` load straight in. Weights are buffers (inference only);
every linear layer holds a dense weight or a ggml-quantized one (`Linear`). The op order follows
the reference wherever float32 rounding could otherwise differ (separate context/noise
projections, norm in float32, cos/sin in float32).

The building blocks live in `blocks` (norms, RoPE, attention helpers, the layers, sampling) and `linear` (the
linear layer and its dense / quantized / packed weights); this module holds the model built from them — the
target's borrowed embedding and head (`TargetHead`), one drafting round (`DraftStep`) and `DFlashDraftModel` —
and re-exports the blocks' names, so ``dflashkit.runtime.dflash`` still offers every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ..divergences.heads import llama_cpp_transforms_logits
from ..spec import DrafterSpec
from .blocks import (ACTIVATIONS, MLP, Attention, DecoderLayer, Embedding, RMSNorm, RotaryEmbedding, apply_rotary,
                     attention_mask, neox_order, repeat_kv, rotate_half, sample_probs, sampling_probs, sink_attention)
from .cache import DraftCache
from .config import first_draft_slot, rope_parameters
from .linear import PACKED_BLOCK_BYTES, PACKED_TILE_BYTES, Linear, packed_tiles, run_tiles, unpack_rows

__all__ = [
    # the model (this module)
    "DFlashDraftModel", "DraftStep", "TargetHead",
    # re-exported from `blocks`
    "ACTIVATIONS", "MLP", "Attention", "DecoderLayer", "Embedding", "RMSNorm", "RotaryEmbedding", "apply_rotary",
    "attention_mask", "neox_order", "repeat_kv", "rotate_half", "sample_probs", "sampling_probs", "sink_attention",
    # re-exported from `linear` (the packed-weight knobs are read there: set them on `linear`)
    "PACKED_BLOCK_BYTES", "PACKED_TILE_BYTES", "Linear", "packed_tiles", "run_tiles", "unpack_rows",
]


# ---------------------------------------------------------------------------------------------
# The target's embedding and head
# ---------------------------------------------------------------------------------------------


class TargetHead(nn.Module):
    """What a drafter borrows from its target: ``embed_tokens`` (noise embedding) and ``lm_head``."""

    def __init__(self, embed_tokens: torch.Tensor | Linear, lm_head: Linear, *, source: str = "") -> None:
        super().__init__()
        # a packed Linear as the table: rows are unpacked on lookup (embed_tokens is then None)
        self.embed_table = embed_tokens if isinstance(embed_tokens, Linear) else None
        self.register_buffer("embed_tokens", None if isinstance(embed_tokens, Linear) else embed_tokens)
        self.lm_head = lm_head
        self.source = source

    @property
    def vocab_size(self) -> int:
        return self.embed_table.out_features if self.embed_table is not None else int(self.embed_tokens.shape[0])

    @property
    def hidden_size(self) -> int:
        return self.embed_table.in_features if self.embed_table is not None else int(self.embed_tokens.shape[1])

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed_table is not None:
            return self.embed_table.rows(ids)
        return F.embedding(ids, self.embed_tokens)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def forward_many(self, hiddens: list[torch.Tensor]) -> list[torch.Tensor]:
        """``forward`` of each hidden state, the head unpacked once for all (`Linear.forward_many`: the same floats)."""
        return self.lm_head.forward_many(hiddens)

    def release(self) -> None:
        """Drop the pages of a head read through a file map (`Linear.release`)."""
        for lin in {id(x): x for x in (self.embed_table, self.lm_head) if x is not None}.values():
            lin.release()


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


@dataclass
class DraftStep:
    """One drafting round: the block's final hidden states, the draft logits and tokens.

    The predicting slots are 1.. (z-lab), or 0.. with ``sample_from_anchor``: n = block − 1 or block.
    """

    hidden: torch.Tensor  # [b, block, hidden]: final-norm output for the whole block
    logits: torch.Tensor | None  # [b, n, target vocab] for the predicting slots (None without a head)
    tokens: torch.Tensor | None  # [b, n] draft target ids (None without a head)
    # the drafter's own rows before `d2t` maps them to target ids ([b, n, draft vocab]; = logits without d2t)
    draft_logits: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # [b, n] DSpark's P(accept) per slot (sigmoid of its head)


class DFlashDraftModel(nn.Module):
    """z-lab's ``DFlashDraftModel``: ``forward`` returns the final-norm hidden states of the block."""

    layer_class: type[DecoderLayer] = DecoderLayer
    #: sampling goes through the block's own candidate selector (`propose`) instead of the head's distribution
    proposes_with_selector: bool = False
    #: a chain drafter reads the token after each context position (EAGLE-3's runtime block sets it)
    reads_context_ids: bool = False
    #: llama.cpp clamps --spec-draft-n-max to the block (speculative.cpp:1016-1023); a chain drafter's: no clamp
    clamps_n_max: bool = True

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.fc = Linear(spec.fc_input_width, h)
        self.hidden_norm = RMSNorm(h, spec.rms_norm_eps)
        self.layers = nn.ModuleList(self.layer_class(spec, i) for i in range(spec.n_layers))
        self.norm = RMSNorm(h, spec.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(spec.head_dim, spec.rope_theta, rope_parameters(spec.rope_scaling))
        self.rotary_emb.follow(spec)  # a llama.cpp GGUF ropes by llama.cpp's rules (n_rot, YaRN defaults)
        # A head of its own (speculators' reduced draft vocabulary, self-contained drafters): its rows are
        # draft ids, mapped to target ids by `d2t` (absolute ids; None = row i is target id i).
        self.lm_head = Linear(h, getattr(spec, "draft_vocab_size", None) or spec.vocab_size or 0) \
            if getattr(spec, "own_lm_head", False) else None
        self.register_buffer("d2t", None)
        # Embeddings of its own (self-contained drafters, MiMo GGUFs): they replace the target's, as llama.cpp's
        # loader takes a drafter file's token_embd over the target's (z-lab's `dflash` has no such drafter).
        self.embed_tokens = Embedding() if getattr(spec, "own_embed_tokens", False) else None
        # MiMo's mask_embedding.pt: the mask token's embedding row, replacing the target's untrained one
        self.register_buffer("mask_embedding", None)

    # -- properties the decoding loop needs ----------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def mask_token_id(self) -> int | None:
        return self.spec.mask_token_id

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.spec.target_layer_ids

    @property
    def first_draft_slot(self) -> int:
        return first_draft_slot(self.spec)

    @property
    def draft_tokens(self) -> int:
        """Tokens drafted per full block."""
        return self.block_size - self.first_draft_slot

    @property
    def family_label(self) -> str:
        return getattr(self.spec, "label", "")

    @property
    def embedding_scale(self) -> float:
        return 1.0 if self.spec.embedding_scale is None else float(self.spec.embedding_scale)

    def new_cache(self) -> DraftCache:
        return DraftCache(self.spec.n_layers)

    # -- forward ------------------------------------------------------------------------------
    def forward(
        self,
        target_hidden: torch.Tensor,
        noise_embedding: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DraftCache | None = None,
    ) -> torch.Tensor:
        """``target_hidden`` [b, ctx, taps × hidden], ``noise_embedding`` [b, block, hidden],
        ``position_ids`` [b, ctx + block] → final-norm hidden states [b, block, hidden].

        With a ``cache``, this call's context and noise keys/values are appended to it; crop it back
        to the context length afterwards (``cache.crop(start)``), as ``dflash_generate`` does.
        """
        x = noise_embedding
        context = self.hidden_norm(self.fc(target_hidden))
        cos, sin = self.rotary_emb(position_ids, x.dtype)
        for layer in self.layers:
            x = layer(x, context, cos, sin, cache)
        return self.norm(x)

    def noise_embedding(self, block_ids: torch.Tensor, head: TargetHead) -> torch.Tensor:
        """The embedding of ``[anchor, mask, ...]`` × the input embedding scale: the drafter's own
        ``embed_tokens`` when it has one, else the target's; with a ``mask_embedding`` (MiMo) the mask token's
        row is that vector — what llama.cpp computes from the ``token_embd`` its converter writes for MiMo
        (the target's embeddings with the mask row replaced)."""
        emb = self.embed_tokens(block_ids) if self.embed_tokens is not None else head.embed(block_ids)
        if self.mask_embedding is not None and self.spec.mask_token_id is not None:
            is_mask = (block_ids == self.spec.mask_token_id).unsqueeze(-1)
            emb = torch.where(is_mask, self.mask_embedding.to(emb.dtype), emb)
        return emb * self.embedding_scale

    @property
    def transforms_logits(self) -> bool:
        """Whether `compute_logits` applies the output multiplier and softcap: always for a reference; for a llama.cpp
        GGUF (``llama_cpp_rules``) only as llama.cpp does, for DFlash 2 (``dflash.cpp`` after the head)."""
        return not getattr(self.spec, "llama_cpp_rules", False) or llama_cpp_transforms_logits(self.spec)

    def compute_logits(self, hidden: torch.Tensor, head: TargetHead | nn.Module) -> torch.Tensor:
        """Target ``lm_head`` (or the drafter's own) × output multiplier, then final logit softcapping (if
        configured; see `transforms_logits`). Rows are the drafter's vocabulary: `to_target_vocab` maps them through
        ``d2t``."""
        logits = (self.lm_head if self.lm_head is not None else head)(hidden)
        if not self.transforms_logits:
            return logits
        logits = logits * (1.0 if self.spec.logit_scale is None else float(self.spec.logit_scale))
        cap = self.spec.final_logit_softcapping
        if cap is not None and float(cap) > 0:
            logits = torch.tanh(logits / float(cap)) * float(cap)
        return logits

    def to_target_vocab(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Draft-vocabulary logits → target vocabulary: row i goes to id ``d2t[i]``, every other id gets
        −inf (as llama.cpp scatters them); unchanged without ``d2t``."""
        if self.d2t is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
        return out.index_copy_(-1, self.d2t, logits)

    def draft_ids_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.d2t is None else self.d2t[ids]

    def select_tokens(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, temperature: float = 0.0
    ) -> torch.Tensor:
        """Draft tokens from the logits of positions 1..: greedy, or sampled at ``temperature``."""
        if temperature <= 0:
            return torch.argmax(logits, dim=-1)
        return sample_probs(sampling_probs(logits, temperature))

    @torch.inference_mode()
    def draft(
        self,
        target_hidden: torch.Tensor,
        block_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DraftCache | None = None,
        head: TargetHead | None = None,
        *,
        noise_embedding: torch.Tensor | None = None,
        temperature: float = 0.0,
    ) -> DraftStep:
        """One round of ``dflash_generate``'s drafting: forward, crop the cache to the context, logits, tokens.

        ``position_ids`` covers this round's context then the block. Without a ``head`` pass
        ``noise_embedding`` and only hidden states come back.
        """
        if noise_embedding is None:
            if head is None:
                raise ValueError("draft() needs the target head or a noise_embedding")
            noise_embedding = self.noise_embedding(block_ids, head)
        hidden = self(target_hidden, noise_embedding, position_ids, cache)
        if cache is not None:
            cache.crop(cache.seq_length - block_ids.shape[1])  # keep the context, drop the block
        if head is None:
            return DraftStep(hidden, None, None)
        draft_hidden = hidden[:, self.first_draft_slot :, :]
        return self.head_step(hidden, draft_hidden, block_ids[:, 0], head, temperature)

    def head_step(self, hidden: torch.Tensor, draft_hidden: torch.Tensor, anchor_ids: torch.Tensor,
                  head: TargetHead, temperature: float) -> DraftStep:
        """Logits and tokens of the predicting slots (DSpark overrides it: its Markov chain)."""
        draft_logits = self.compute_logits(draft_hidden, head)
        logits = self.to_target_vocab(draft_logits, head.vocab_size)
        tokens = self.select_tokens(draft_hidden, logits, anchor_ids, temperature)
        return DraftStep(hidden, logits, tokens, draft_logits)
