"""EAGLE-3 drafter in plain PyTorch: llama.cpp's graph (``src/models/eagle3.cpp``) and its ``draft-eagle3`` chain.

Specification: llama.cpp 0.3.36's ``src/models/eagle3.cpp`` (docs/design/eagle3.md §4.1; b11549's is identical):

- encoder, ``graph<true>`` (lines 124-146): ``f`` = the 3 taps concatenated; ``norm_before_fc``:
  ``f = RMSNorm(f) · enc.output_norm`` (``input_norm.weight`` here, 131-134); ``g = fc · f`` (137) → `encode`.
- decoder, ``graph<false>`` (151-326) → `Eagle3DraftModel.step`: ``e = token_embd[tok]`` — the drafter's own, else
  the target's (164-172, 181); ``en = RMSNorm(e) · attn_norm`` (202-205); ``gn = RMSNorm(g) · attn_norm_2``
  (208-211); residual ``gn`` when ``norm_before_residual`` else ``g`` (217); ``x = concat(en, gn)`` — the
  embedding first (220); ``Q, K, V = wq·x, wk·x, wv·x`` (224-235); RoPE at the row's position with
  ``rope_freqs`` when present (238-251); attention over the KV cache, scale ``1/sqrt(head_dim)``, ``wo``
  (196, 255-257); ``+ residual`` (260); ``ffn_norm``, SwiGLU, ``+`` (263-279); the **pre-norm** state is output
  for the chain (284-288); ``logits = output · (RMSNorm(h) · output_norm)`` over the draft vocabulary — the
  target's ``output`` when the drafter has none (290-305); with ``d2t``: a target-vocabulary row of −inf with the
  draft logits written at rows ``d2t`` (307-320).
- the chain (``common/speculative.cpp``, ``draft-eagle3``; §5) → `Eagle3DraftModel.draft`: every committed position p
  since the last round becomes a cached row (token p + 1, g_p) at position p — the last one, whose token is the
  anchor, is llama.cpp's seed — and each drafted token is fed back with the previous step's pre-norm state at the
  next position; greedy (the first of top-k 10). Rows from the seed's position on are dropped before each round.

Weights are held as the runtime's loader fills them (`dflashkit.runtime.load`: one module per canonical id, dense,
ggml-quantized or packed `Linear`s), q/k rows in llama.cpp's order (``LlamaModel.permute``: an HF checkpoint is
permuted on load as the converter permutes it, a GGUF is so already): RoPE rotates adjacent pairs (ggml's NORM
mode), the same arithmetic on the same pairs as the checkpoint's rotate-half. RoPE angle for pair i at position p:
``freq_scale · p · base^(−2i/d) / freq_factors[i]`` (``freq_scale`` = 1/factor for ``linear``); YaRN is not run.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import DFlashError
from ...runtime.blocks import Embedding, RMSNorm, sample_probs, sampling_probs
from ...runtime.dflash import DraftStep, TargetHead
from ...runtime.linear import Linear
from ...spec import DrafterSpec
from . import FAMILY


class KVCache:
    """The drafter's own KV cache for one sequence: keys/values [b, n_kv, L, head_dim] and each row's position
    (llama.cpp masks by position: a query at p sees every cached key at a position ≤ p)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.positions = torch.empty(0, dtype=torch.long)

    def __len__(self) -> int:
        return int(self.positions.numel())

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.positions = torch.cat([self.positions.to(positions.device), positions.to(torch.long)])
        return self.k, self.v

    def remove_from(self, position: int) -> None:
        """Drop every row at a position ≥ ``position`` (``llama_memory_seq_rm(mem, seq, position, -1)``)."""
        keep = self.positions < position
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k[:, :, keep], self.v[:, :, keep]
        self.positions = self.positions[keep]

    def crop(self, length: int) -> None:
        self.remove_from(length)  # rows sit at positions 0 … L−1


class _Attention(nn.Module):
    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        h, hd = spec.hidden_size, spec.head_dim
        self.q_proj = Linear(2 * h, spec.n_heads * hd)
        self.k_proj = Linear(2 * h, spec.n_kv_heads * hd)
        self.v_proj = Linear(2 * h, spec.n_kv_heads * hd)
        self.o_proj = Linear(spec.n_heads * hd, h)


class _MLP(nn.Module):
    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        h, f = spec.hidden_size, spec.intermediate_size
        self.gate_proj, self.up_proj, self.down_proj = Linear(h, f), Linear(h, f), Linear(f, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn, self.mlp = _Attention(spec), _MLP(spec)


class _Factors(nn.Module):
    """``rope_freqs.weight`` of a GGUF (a ``llama3`` RoPE's per-pair divisors)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", None)


class Eagle3DraftModel(nn.Module):
    """One EAGLE-3 decoder layer run as llama.cpp's ``eagle3`` graph, drafting as its ``draft-eagle3`` does."""

    #: the decoding loops pass, beside each context position's features, the token that follows it (`draft`)
    reads_context_ids = True
    clamps_n_max = FAMILY.clamps_n_max  # the family's fact: draft-eagle3 drafts any n-max
    proposes_with_selector = False

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        if spec.n_layers != 1:
            raise DFlashError(f"EAGLE-3 drafter: llama.cpp's graph runs exactly one decoder layer, got {spec.n_layers}")
        scaling = dict(spec.rope_scaling or ())
        if scaling and scaling.get("type") != "linear":
            raise DFlashError(f"EAGLE-3 drafter: RoPE scaling {scaling.get('type')!r} is not run by dflashkit's "
                              "runtime (default, llama3 and linear are)")
        self.spec = spec
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.freq_scale = 1.0 / float(scaling["factor"]) if scaling else 1.0
        self.fc = Linear(spec.fc_input_width, h)
        self.input_norm = RMSNorm(spec.fc_input_width, eps) if spec.norm_before_fc else None
        self.layers = nn.ModuleList([_Layer(spec)])
        self.norm = RMSNorm(h, eps)
        vocab = spec.vocab_size or 0
        self.lm_head = Linear(h, spec.draft_vocab_size or vocab) if getattr(spec, "own_lm_head", False) else None
        self.embed_tokens = Embedding() if getattr(spec, "own_embed_tokens", False) else None
        self.rope_freqs = _Factors()
        if spec.rope_freq_factors is not None:
            self.rope_freqs.weight = torch.tensor(spec.rope_freq_factors, dtype=torch.float32)
        self.register_buffer("d2t", None)

    # -- what the decoding loops ask -----------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def mask_token_id(self) -> int | None:
        return None

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.spec.target_layer_ids

    @property
    def first_draft_slot(self) -> int:
        return 1  # the anchor only seeds the chain

    @property
    def draft_tokens(self) -> int:
        return self.block_size - 1

    @property
    def family_label(self) -> str:
        return getattr(self.spec, "label", "")

    @property
    def embedding_scale(self) -> float:
        return 1.0

    def new_cache(self) -> KVCache:
        return KVCache()

    def noise_embedding(self, ids: torch.Tensor, head: TargetHead | None) -> torch.Tensor:
        """The embedding of the round's ids (the anchor first): what a report shows of a round's input (a chain
        drafter embeds each token as it drafts it)."""
        return self._embed(ids, head)

    # -- the two graphs ------------------------------------------------------------------------
    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """``graph<true>``: fused taps [b, t, 3·Ht] → g [b, t, H]."""
        x = features.to(self.norm.weight.dtype)
        return self.fc(self.input_norm(x) if self.input_norm is not None else x)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """ggml's NORM RoPE: pair (2i, 2i + 1) of each head rotated by freq_scale · p · base^(−2i/d) / factor_i."""
        d = x.shape[-1]
        inv = 1.0 / (float(self.spec.rope_theta) ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
        if self.rope_freqs.weight is not None:
            inv = inv / self.rope_freqs.weight.to(device=x.device, dtype=torch.float32)
        angle = (positions.to(torch.float32) * self.freq_scale)[:, None] * inv[None, :]  # [t, d/2]
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def _embed(self, ids: torch.Tensor, head: TargetHead | None) -> torch.Tensor:
        if self.embed_tokens is not None:
            return self.embed_tokens(ids)
        if head is None:
            raise DFlashError("an EAGLE-3 drafter without its own token_embd reads the target's: pass the target head")
        return head.embed(ids)

    def _head(self, hidden: torch.Tensor, head: TargetHead | None) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden)
        if head is None:
            raise DFlashError("an EAGLE-3 drafter without its own output head reads the target's: pass the target head")
        return head(hidden)

    def step(self, token_ids: torch.Tensor, g: torch.Tensor, positions: torch.Tensor, cache: KVCache,
             head: TargetHead | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``graph<false>`` on rows (token_ids [b, t], g [b, t, H]) at ``positions`` [t], appending their K/V to
        ``cache``: (logits over the target vocabulary, −inf outside ``d2t``; draft-vocabulary logits; the pre-norm
        state — the next chain step's g)."""
        layer, spec = self.layers[0], self.spec
        b, t = token_ids.shape
        positions = positions.reshape(-1).to(torch.long)
        gn = layer.hidden_norm(g)
        residual = gn if spec.norm_before_residual else g
        x = torch.cat([layer.input_layernorm(self._embed(token_ids, head).to(g.dtype)), gn], dim=-1)
        hd, nh, nkv = spec.head_dim, spec.n_heads, spec.n_kv_heads
        attn = layer.self_attn
        q = self._rope(attn.q_proj(x).view(b, t, nh, hd).transpose(1, 2), positions)
        k = self._rope(attn.k_proj(x).view(b, t, nkv, hd).transpose(1, 2), positions)
        v = attn.v_proj(x).view(b, t, nkv, hd).transpose(1, 2)
        keys, values = cache.append(k, v, positions)
        group = nh // nkv  # ggml's broadcast: q head h reads kv head h // group
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = (q @ keys.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        visible = cache.positions.to(positions.device)[None, :] <= positions[:, None]
        out = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ values
        h = attn.o_proj(out.transpose(1, 2).reshape(b, t, nh * hd)) + residual
        prenorm = layer.mlp(layer.post_attention_layernorm(h)) + h
        draft_logits = self._head(self.norm(prenorm), head)
        return self.to_target_vocab(draft_logits, spec.vocab_size or draft_logits.shape[-1]), draft_logits, prenorm

    def to_target_vocab(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Draft rows → target ids through ``d2t`` (−inf elsewhere, as llama.cpp scatters them)."""
        if self.d2t is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
        return out.index_copy_(-1, self.d2t, logits)

    # -- one round of chain drafting -----------------------------------------------------------
    @torch.inference_mode()
    def draft(self, context: torch.Tensor, noise_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
              head: TargetHead | None = None, *, temperature: float = 0.0, context_ids: torch.Tensor | None = None,
              **_: Any) -> DraftStep:
        """One ``draft-eagle3`` round: ``context`` [1, n, 3·Ht] the taps of the positions committed since the last
        round (``positions[0, :n]``), ``context_ids`` [1, n] the token after each (the last is the anchor,
        ``noise_ids[0, 0]``); drafts ``noise_ids.shape[1] − 1`` tokens."""
        if context_ids is None or context_ids.shape[1] != context.shape[1]:
            raise DFlashError("an EAGLE-3 round needs the token after each context position (context_ids)")
        n_ctx, n_draft = context.shape[1], noise_ids.shape[1] - 1
        pos = positions[0].to(torch.long)
        cache.remove_from(int(pos[0]))  # the last round's seed and chain rows
        g = self.encode(context)
        logits, draft_logits, prenorm = self.step(context_ids, g, pos[:n_ctx], cache, head)
        logits, draft_logits, prenorm = logits[:, -1:], draft_logits[:, -1:], prenorm[:, -1:]
        seed = int(pos[n_ctx - 1])
        rows_logits, rows_draft, rows_hidden, tokens = [], [], [], []
        for i in range(n_draft):
            if i:
                logits, draft_logits, prenorm = self.step(tokens[-1], prenorm, torch.tensor([seed + i]), cache, head)
            picked = (torch.argmax(logits[:, -1], dim=-1) if temperature <= 0
                      else sample_probs(sampling_probs(logits[:, -1], temperature)))
            tokens.append(picked.reshape(1, 1))
            rows_logits.append(logits)
            rows_draft.append(draft_logits)
            rows_hidden.append(prenorm)
        if not tokens:
            empty = context.new_zeros((1, 0, self.spec.vocab_size or 0))
            return DraftStep(context.new_zeros((1, 0, self.spec.hidden_size)), empty, noise_ids[:, :0], empty)
        # hidden: the seed's g (slot 0, the anchor's row), then each step's pre-norm state — a block's rows
        return DraftStep(hidden=torch.cat([g[:, -1:], *rows_hidden], dim=1), logits=torch.cat(rows_logits, dim=1),
                         tokens=torch.cat(tokens, dim=1), draft_logits=torch.cat(rows_draft, dim=1))
