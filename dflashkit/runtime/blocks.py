"""The building blocks of the DFlash drafter, apart from the model that stacks them (`dflash`).

Norms (`RMSNorm`), a lookup table (`Embedding`), RoPE (`RotaryEmbedding`, `apply_rotary`, `neox_order`), the
attention helpers (`attention_mask`, `repeat_kv`, `sink_attention`), the layers (`Attention`, `MLP`,
`DecoderLayer`) and the reference's temperature sampling (`sampling_probs`, `sample_probs`). Every family's
runtime builds on them; the op order follows z-lab's reference wherever float32 rounding could otherwise differ
(see `dflash`). The layers' matrices are `linear.Linear`s.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from ..causality import runtime_causal_layers
from ..divergences.rope import attention_value_scale, partial_rotary_dims, yarn_llama_cpp
from ..spec import DrafterSpec
from .cache import DraftCache
from .linear import Linear

# ---------------------------------------------------------------------------------------------
# Norms, embeddings, RoPE and attention helpers
# ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: normalise in float32, cast back, then scale."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Embedding(nn.Module):
    """A lookup table (the DFlash 2 selector codebooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", None)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RotaryEmbedding(nn.Module):
    """RoPE over the whole head, as transformers' Qwen3RotaryEmbedding computes it, with its ``linear``
    and ``yarn`` scaling (``transformers.modeling_rope_utils``: ``_compute_linear_scaling_rope_parameters``,
    ``_compute_yarn_parameters``; yarn's attention factor multiplies cos and sin).

    z-lab's reference builds its rotary embedding from a Qwen3 config, which applies RoPE to the full
    ``head_dim``: a ``partial_rotary_factor`` in the config does not change it, so it does not here. A llama.cpp
    GGUF (`follow`) runs by llama.cpp's rules: ``rotary_dims`` (``n_rot``) wide tables — `apply_rotary` then ropes
    the first ``rotary_dims`` of the head — and YaRN with llama.cpp's defaults (`dflashkit.divergences.rope`).
    """

    def __init__(self, head_dim: int, theta: float, scaling: Mapping[str, Any] | None = None, *,
                 rotary_dims: int | None = None, llama_cpp: bool = False) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.scaling = dict(scaling) if scaling else None
        self.rotary_dims, self.llama_cpp = rotary_dims, llama_cpp

    def follow(self, spec: DrafterSpec) -> None:
        """Run ``spec`` as llama.cpp does when it is a llama.cpp GGUF (``llama_cpp_rules``); else leave it so."""
        if getattr(spec, "llama_cpp_rules", False):
            self.llama_cpp, self.rotary_dims = True, partial_rotary_dims(spec)

    def inv_freq(self) -> tuple[torch.Tensor, float]:
        """(inverse frequencies [rotary dims / 2], factor applied to cos/sin)."""
        dim = self.rotary_dims or self.head_dim
        pos_freqs = self.theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
        inv_freq = 1.0 / pos_freqs
        kind = (self.scaling or {}).get("rope_type", "default")
        if kind == "linear":
            return inv_freq / float(self.scaling["factor"]), 1.0  # type: ignore[index]
        if kind != "yarn":
            return inv_freq, 1.0
        p = dict(self.scaling or {})
        factor = float(p["factor"])
        if self.llama_cpp:  # llama.cpp reads none of the config's yarn extras for dflash
            p = {**p, **yarn_llama_cpp(factor), "truncate": True}
        attention_factor = p.get("attention_factor")
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if attention_factor is None:
            attention_factor = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                                if mscale and mscale_all_dim else get_mscale(factor))
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1
        original = p["original_max_position_embeddings"]

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(self.theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + inv_freq * extrapolation
        return inv_freq, float(attention_factor)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # Computed on the fly in float32: a buffer would be cast to bf16 by `model.to(dtype)`.
        inv_freq, scale = self.inv_freq()
        inv_freq = inv_freq.to(position_ids.device)
        freqs = (inv_freq[None, :, None] @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def neox_order(head_dim: int) -> torch.Tensor:
    """Head-dim permutation interleaved → NeoX (even dims, then odd): what llama.cpp's converter applies
    to q/k of a ``rope_is_neox_style: false`` checkpoint, so that NeoX RoPE on the permuted head equals
    interleaved RoPE on the original one (attention scores are invariant to a shared q/k permutation)."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE; ``cos``/``sin`` cover context + noise, the queries (noise only) take the last ``q_len``. Tables
    narrower than the head (``rotary_dims``, llama.cpp's ``n_rot``) rope its first dims NeoX-style, the rest pass."""
    n = cos.shape[-1]
    if n < q.shape[-1]:
        q_rot, k_rot = apply_rotary(q[..., :n], k[..., :n], cos, sin)
        return torch.cat((q_rot, q[..., n:]), dim=-1), torch.cat((k_rot, k[..., n:]), dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q_len = q.shape[-2]
    q = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
    k = k * cos + rotate_half(k) * sin
    return q, k


def attention_mask(q_len: int, k_len: int, *, causal: bool, window: int | None, device: torch.device,
                   window_from_anchor: bool = False, window_past_only: bool = False) -> torch.Tensor:
    """Boolean ``[1, 1, q_len, k_len]`` visibility; queries are the last ``q_len`` key positions.

    ``window_from_anchor`` (speculators' ``create_anchor_block_mask_mod``): the block sees the ``window``
    context positions before the anchor (the block's first position) and the block itself. A bidirectional layer's
    window hides positions ahead of a query too (z-lab), except ``window_past_only`` (llama.cpp's
    ``is_masked_swa``: masked iff ``p1 - p0 >= n_swa``, behind only).
    """
    q_pos = k_len - q_len + torch.arange(q_len, device=device)[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    visible = torch.ones((q_len, k_len), dtype=torch.bool, device=device)
    if causal:
        visible &= k_pos <= q_pos
    if window_from_anchor:
        if window is not None:
            visible &= k_pos >= k_len - q_len - window
        return visible[None, None]
    if window is not None:
        visible &= q_pos - k_pos < window
        if not causal and not window_past_only:
            visible &= k_pos - q_pos < window
    return visible[None, None]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[b, kv_heads, len, d]`` → ``[b, kv_heads * n_rep, len, d]`` (each kv head serves n_rep query heads)."""
    if n_rep == 1:
        return x
    b, kv, length, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, length, d).reshape(b, kv * n_rep, length, d)


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   sinks: torch.Tensor, scaling: float) -> torch.Tensor:
    """Attention with a per-head sink logit in the softmax denominator (no value), as transformers'
    gpt-oss ``eager_attention_forward``: softmax over [scores, sink], the sink column dropped."""
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], 1).to(scores.dtype)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, spec: DrafterSpec, layer: int) -> None:
        super().__init__()
        h, hd = spec.hidden_size, spec.head_dim
        self.layer, self.head_dim = layer, hd
        self.n_rep = spec.n_heads // spec.n_kv_heads
        self.scaling = hd**-0.5
        self.q_proj = Linear(h, spec.n_heads * hd)
        self.k_proj = Linear(h, spec.n_kv_heads * hd)
        self.v_proj = Linear(h, spec.n_kv_heads * hd)
        self.o_proj = Linear(spec.n_heads * hd, h)
        self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
        self.k_norm = RMSNorm(hd, spec.rms_norm_eps)
        pattern = spec.sliding_window_pattern or ()
        sliding = layer < len(pattern) and bool(pattern[layer])
        self.window_from_anchor = bool(getattr(spec, "window_from_anchor", False))
        # z-lab: sliding layers causal, full ones not, unless is_causal says; speculators: sliding ones causal unless
        # told; a GGUF as llama.cpp runs it: one flag for every layer (`dflashkit.causality`)
        self.causal = runtime_causal_layers(spec)[layer]
        self.window = spec.sliding_window if sliding else None
        self.window_past_only = bool(getattr(spec, "llama_cpp_masks", False))  # llama.cpp's SWA mask (is_masked_swa)
        # Interleaved-RoPE checkpoints (HF layout): q/k go to NeoX order before RoPE (see `neox_order`).
        self.register_buffer("rope_order", neox_order(hd) if getattr(spec, "rope_interleaved", False) else None,
                             persistent=False)
        self.register_buffer("sinks", None)  # [n_heads] attention-sink logits (gpt-oss / MiMo), when present
        # llama.cpp scales the attention output (after o_proj) by dflash.attention.value_scale; the reference does not
        self.value_scale = attention_value_scale(spec) if getattr(spec, "llama_cpp_rules", False) else None

    def query(self, x: torch.Tensor, context: torch.Tensor) -> tuple[int, int, int, torch.Tensor]:
        """(batch, block length, context length, the block's normed queries [b, heads, q_len, head_dim])."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, -1, self.head_dim)).transpose(1, 2)
        return b, q_len, context.shape[1], q

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: DraftCache | None) -> torch.Tensor:
        b, q_len, ctx_len, q = self.query(x, context)
        # Context and noise are projected separately, as in the reference (same float32 rounding).
        k = torch.cat([self.k_proj(context), self.k_proj(x)], dim=1).view(b, ctx_len + q_len, -1, self.head_dim)
        v = torch.cat([self.v_proj(context), self.v_proj(x)], dim=1).view(b, ctx_len + q_len, -1, self.head_dim)
        k = self.k_norm(k).transpose(1, 2)
        v = v.transpose(1, 2)
        if self.rope_order is not None:
            q, k = q[..., self.rope_order], k[..., self.rope_order]
        q, k = apply_rotary(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        mask = None
        if self.causal or self.window is not None:
            mask = attention_mask(q_len, k.shape[-2], causal=self.causal, window=self.window, device=x.device,
                                  window_from_anchor=self.window_from_anchor, window_past_only=self.window_past_only)
        if self.sinks is not None:
            out = sink_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), mask, self.sinks, self.scaling)
        elif mask is not None:
            out = F.scaled_dot_product_attention(
                q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), attn_mask=mask, scale=self.scaling
            )
        else:
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scaling, enable_gqa=self.n_rep > 1)
        return self.output(out, b, q_len)

    def output(self, out: torch.Tensor, b: int, q_len: int) -> torch.Tensor:
        """``o_proj`` of the heads' outputs, then llama.cpp's value scale where it applies (``dflash.cpp``)."""
        out = self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))
        return out if self.value_scale is None else out * self.value_scale


#: ``hidden_act`` → the gate activation (transformers' ACT2FN: "gelu" is the exact erf GELU).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}


class MLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``, act = silu (SwiGLU) or gelu (GeGLU) per ``hidden_act``."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.gate_proj = Linear(spec.hidden_size, spec.intermediate_size)
        self.up_proj = Linear(spec.hidden_size, spec.intermediate_size)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size)
        self.act = ACTIVATIONS[spec.hidden_act or "silu"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP blocks with residuals. DFlash 2 wraps both blocks (see `around`)."""

    def __init__(self, spec: DrafterSpec, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(spec, layer)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def around(self, block: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Run one block (``"attention"`` or ``"mlp"``) on its normed input; DFlash 2 adds convolutions."""
        return fn(x)

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: DraftCache | None) -> torch.Tensor:
        attn = functools.partial(self.self_attn, context=context, cos=cos, sin=sin, cache=cache)
        x = x + self.around("attention", attn, self.input_layernorm(x))
        return x + self.around("mlp", self.mlp, self.post_attention_layernorm(x))


# ---------------------------------------------------------------------------------------------
# Sampling (the reference's temperature path; greedy needs none of it)
# ---------------------------------------------------------------------------------------------


def sampling_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample_probs(probs: torch.Tensor) -> torch.Tensor:
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).view(probs.shape[:-1])
