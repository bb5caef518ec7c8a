"""Gemma-4 DSpark (``Gemma4DSparkModel``): the DSpark heads of `dspark.py` on a Gemma-4 backbone.

Specification: llama.cpp's ``src/models/dflash.cpp`` (the DFlash decoder graph with the tensors a Gemma-4
DSpark GGUF carries, as ``conversion/gemma.py`` ``Gemma4DSparkModel`` writes them) for what runs, and
transformers' ``models/gemma4/modeling_gemma4.py`` (``Gemma4TextAttention`` with ``attention_k_eq_v``,
``Gemma4TextDecoderLayer``, ``Gemma4RMSNorm``, proportional RoPE) for the maths of each block:

- noise stream: the target's embedding × ``embedding_scale`` (√hidden); context stream: ``fc`` →
  ``hidden_norm`` of the target taps, as in DFlash (`dflash.py`), keys/values of context and block
  concatenated, the block non-causal;
- attention (k_eq_v, no ``v_proj``): Q = ``q_norm``(q_proj x), K = ``k_norm``(k_proj ·), V = an RMS
  norm *without weight* of the same k_proj output (before ``k_norm``) — dflash.cpp's
  ``ggml_rms_norm(Kcur)`` and transformers' ``v_norm`` (``with_scale=False``); softmax scale 1.0
  (``attention.scale``); RoPE on Q and K only;
- RoPE over the global head dim, NeoX, scaled per frequency by llama.cpp's ``rope_freqs.weight``
  (1.0 for the rotated pairs, 1e30 for the rest: `ProportionalRotaryEmbedding`);
- sandwich norms and the layer scalar: ``h = x + post_attention_norm(attn(input_layernorm x))``,
  ``out = (h + post_feedforward_layernorm(mlp(pre-FFN norm h))) · layer_scalar``; the MLP is GeGLU
  with the tanh GELU (``gelu_pytorch_tanh``);
- final ``norm``, the drafter's own full-vocabulary ``lm_head`` (dflash.cpp uses a drafter's
  ``output`` whenever it has one), then the Markov chain and confidence head of `DSparkDraftModel`.

Gemma's RMSNorm (``Gemma4RMSNorm``: ``x · (mean(x²) + eps)^−½ · weight`` in float32, no ``1 + weight``
offset in Gemma 4) is used for every norm. Canonical ids (`dflashkit.families.gemma4_dspark`): Gemma's
``post_attention_layernorm`` is ``post_attention_norm``, its ``pre_feedforward_layernorm`` takes z-lab's
pre-FFN id ``post_attention_layernorm``, ``layer_scalar.weight``, ``rope_freqs.weight``.

Where the two specifications differ (llama.cpp's semantics run here, since the GGUF is what llama.cpp
runs): proportional RoPE — transformers gives the unrotated pairs a frequency of exactly 0, llama.cpp
divides theirs by 1e30 (an angle of ~1e-30 · position: cos = 1, |sin| < 1e-24; below float32 resolution
of the result); the embedding scale — transformers casts √hidden to the embedding's dtype before
multiplying (bfloat16 rounds it unless hidden is a perfect square), llama.cpp keeps it float32.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ...spec import DrafterSpec
from ...runtime.cache import DraftCache
from ...runtime.dflash import (MLP, Attention, RMSNorm, RotaryEmbedding, apply_rotary, attention_mask, repeat_kv,
                     sink_attention)
from ..dspark.runtime import DSparkDraftModel

ARCH_GEMMA4_DSPARK = "Gemma4DSparkModel"


class GemmaRMSNorm(RMSNorm):
    """``Gemma4RMSNorm``: normalise and scale in float32, then cast back (``torch.pow``, as transformers)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms_normalize(x, self.eps) * self.weight.float()).to(x.dtype)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalisation without a weight, in float32 (Gemma's ``v_norm``; llama.cpp's ``ggml_rms_norm``)."""
    x = x.float()
    return x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)


class LayerScalar(nn.Module):
    """Gemma-4's per-layer output multiplier (``layer_scalar``; llama.cpp's ``layer_output_scale``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(1))


class ProportionalRotaryEmbedding(RotaryEmbedding):
    """NeoX RoPE over the whole head with llama.cpp's per-pair frequency factors (``rope_freqs.weight``,
    ``ggml_rope_ext``'s ``freq_factors``: θ_i = pos · base^(−2i/d) / factor_i). Without factors (a Gemma-4
    DSpark with default RoPE) every pair rotates."""

    def __init__(self, head_dim: int, theta: float, factors: Sequence[float] | None) -> None:
        super().__init__(head_dim, theta)
        self.register_buffer("weight", None if factors is None else torch.tensor(factors, dtype=torch.float32))

    def inv_freq(self) -> tuple[torch.Tensor, float]:
        inv_freq, scale = super().inv_freq()
        if self.weight is not None:
            inv_freq = inv_freq / self.weight.float().cpu()  # 1e30 (bfloat16 holds it; float16 makes it inf → 0)
        return inv_freq, scale


class Gemma4Attention(Attention):
    """k_eq_v attention: values are the unweighted RMS norm of the key projection (no ``v_proj``)."""

    def __init__(self, spec: DrafterSpec, layer: int) -> None:
        super().__init__(spec, layer)
        del self.v_proj
        self.eps = spec.rms_norm_eps
        self.q_norm = GemmaRMSNorm(spec.head_dim, spec.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(spec.head_dim, spec.rms_norm_eps)
        scale = getattr(spec, "attention_scale", None)
        self.scaling = spec.head_dim**-0.5 if scale is None else float(scale)

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: DraftCache | None) -> torch.Tensor:
        b, q_len, ctx_len, q = self.query(x, context)
        kv = torch.cat([self.k_proj(context), self.k_proj(x)], dim=1).view(b, ctx_len + q_len, -1, self.head_dim)
        k = self.k_norm(kv).transpose(1, 2)
        v = rms_normalize(kv, self.eps).to(kv.dtype).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        mask = None
        if self.causal or self.window is not None:
            mask = attention_mask(q_len, k.shape[-2], causal=self.causal, window=self.window, device=x.device,
                                  window_past_only=self.window_past_only)
        if self.sinks is not None:  # dflash.cpp passes a layer's attn_sinks to every DFlash attention
            out = sink_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), mask, self.sinks, self.scaling)
        elif mask is not None:
            out = F.scaled_dot_product_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep),
                                                 attn_mask=mask, scale=self.scaling)
        else:
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scaling, enable_gqa=self.n_rep > 1)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class Gemma4DecoderLayer(nn.Module):
    """Gemma-4's sandwich-norm block with the DFlash context (see the module doc for the names)."""

    def __init__(self, spec: DrafterSpec, layer: int) -> None:
        super().__init__()
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.self_attn = Gemma4Attention(spec, layer)
        self.mlp = MLP(spec)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_norm = GemmaRMSNorm(h, eps)  # Gemma's post_attention_layernorm (attn_post_norm)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)  # Gemma's pre_feedforward_layernorm (ffn_norm)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)  # (ffn_post_norm)
        self.layer_scalar = LayerScalar()

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: DraftCache | None) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), context, cos, sin, cache)
        x = x + self.post_attention_norm(attn)
        x = x + self.post_feedforward_layernorm(self.mlp(self.post_attention_layernorm(x)))
        return x * self.layer_scalar.weight


class Gemma4DSparkDraftModel(DSparkDraftModel):
    """`DSparkDraftModel` with Gemma-4 layers, Gemma norms and proportional RoPE."""

    layer_class = Gemma4DecoderLayer

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__(spec)
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.hidden_norm = GemmaRMSNorm(h, eps)
        self.norm = GemmaRMSNorm(h, eps)
        # an HF checkpoint: factors from its rope_parameters (the family computes them as llama.cpp's converter
        # does); a GGUF: its rope_freqs.weight tensor, loaded over None
        self.rotary_emb = ProportionalRotaryEmbedding(spec.head_dim, spec.rope_theta,
                                                      getattr(spec, "rope_freq_factors", None))

    @property
    def rope_freqs(self) -> ProportionalRotaryEmbedding:
        """Where canonical ``rope_freqs.weight`` loads (``get_submodule("rope_freqs")``): the rotary embedding."""
        return self.rotary_emb
