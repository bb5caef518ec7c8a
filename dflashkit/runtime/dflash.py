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
4. logits = target ``lm_head`` × output multiplier, then ``tanh`` softcapping when configured.

Module and tensor names mirror the HF checkpoint (``layers.0.self_attn.q_proj.weight``), so the
canonical ids of `dflashkit.drafters` load straight in. Weights are buffers (inference only);
every linear layer holds a dense weight or a ggml-quantized one (`Linear`). The op order follows
the reference wherever float32 rounding could otherwise differ (separate context/noise
projections, norm in float32, cos/sin in float32).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from ..codecs import QUANT_TYPES, dequantize_into, to_float32
from ..kernels.reference import FLOAT_VIEWS
from ..spec import DrafterSpec
from .cache import DraftCache
from .config import rope_parameters

# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with W dense (a float buffer) or ggml-quantized (uint8 blocks + type).

    Quantized weights stay quantized in memory and run through ``dflashkit.kernels.qmatmul``.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", None)
        self.register_buffer("bias", None)
        self.register_buffer("qdata", None)  # uint8 [out_features, row_bytes] when quantized
        self.ggml_type: Any = None
        self.packed = False  # qdata holds the file's bytes, unpacked to float32 at each forward

    @property
    def is_quantized(self) -> bool:
        return self.qdata is not None and not self.packed

    @property
    def is_loaded(self) -> bool:
        return self.weight is not None or self.qdata is not None

    def set_weight(self, weight: torch.Tensor) -> None:
        self._check_shape(tuple(weight.shape))
        self.weight, self.qdata, self.ggml_type = weight, None, None

    def set_quantized(self, data: torch.Tensor, ggml_type: Any) -> None:
        self.weight, self.qdata, self.ggml_type, self.packed = None, data, ggml_type, False

    def set_packed(self, data: torch.Tensor, ggml_type: Any) -> None:
        """Keep the weight as the file stores it (uint8 [out_features, row_bytes] of BF16/F16/ggml blocks)
        and unpack it to float32 in each forward, in row blocks of at most ``PACKED_BLOCK_BYTES`` (on the CPU
        tile by tile into one reused buffer, `packed_tiles`): the same float32 weights as unpacking on load
        (results equal within float32 rounding of the blocked matmul), at the file's size in memory."""
        self.weight, self.qdata, self.ggml_type, self.packed = None, data, ggml_type, True

    def _packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.qdata is not None
        outs: list[torch.Tensor] = []

        def run(a: int, b: int, buf: torch.Tensor | None) -> None:
            # rows a..b unpacked (on the CPU into the reused buffer): the output columns a..b
            w = unpack_rows(self.qdata[a:b], self.ggml_type, (b - a, self.in_features), out=buf)
            outs.append(F.linear(x, w.to(x.dtype), None if self.bias is None else self.bias[a:b]))

        tiles = packed_tiles(self.out_features, self.in_features, x.device)
        if x.device.type != "cpu" or (x.requires_grad and torch.is_grad_enabled()):
            for a, b in tiles:  # (autograd keeps each tile's weight for the backward: no shared buffer)
                run(a, b, None)
        else:
            run_tiles(tiles, self.in_features, run)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the weight as float32 (an embedding lookup), unpacking only those rows."""
        if self.qdata is None or not self.packed:
            return F.embedding(ids, self.weight)
        flat = ids.reshape(-1)
        out = unpack_rows(self.qdata[flat], self.ggml_type, (flat.numel(), self.in_features))
        return out.reshape(*ids.shape, self.in_features)

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        if shape != (self.out_features, self.in_features):
            raise ValueError(f"weight shape {list(shape)} ≠ expected {[self.out_features, self.in_features]}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qdata is not None and self.packed:
            return self._packed_forward(x)
        if self.qdata is not None:
            from ..kernels import QuantizedWeight, qmatmul  # only reached when the loader found them

            w = QuantizedWeight(self.qdata, self.ggml_type, (self.out_features, self.in_features))
            y = qmatmul(x, w).to(x.dtype)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        kind = f"quantized {getattr(self.ggml_type, 'name', self.ggml_type)}" if self.is_quantized else "dense"
        return f"in={self.in_features}, out={self.out_features}, {kind}"


#: float32 bytes of one unpacked row block of a packed Linear: a vocabulary projection runs in blocks of at most
#: this many bytes (the block boundaries fix which rows share a matmul call, hence its float32 rounding)
PACKED_BLOCK_BYTES = 64 << 20
#: float32 bytes of one tile of a block on the CPU: a tile is unpacked into a reused buffer and multiplied while it
#: is still in the cache. Tiles have a multiple of 16 rows from the block's start (the last one takes the rest):
#: torch's CPU matmul (MKL) then gives the same floats as one call over the whole block — its sgemv path for a
#: single input row groups output rows by 4 — which tests/test_runtime.py checks
PACKED_TILE_BYTES = 2 << 20
_TILE_ROWS_MULTIPLE = 16


def packed_tiles(rows: int, in_features: int, device: torch.device | None = None) -> list[tuple[int, int]]:
    """Row ranges ``[a, b)`` a packed matmul unpacks one at a time: the blocks of ``PACKED_BLOCK_BYTES`` and, on
    the CPU, tiles of ``PACKED_TILE_BYTES`` inside each (the last tile of a block takes the block's remainder,
    so it has between one and two tiles' rows)."""
    block = max(1, PACKED_BLOCK_BYTES // (4 * in_features))
    tile = max(_TILE_ROWS_MULTIPLE, PACKED_TILE_BYTES // (4 * in_features) // _TILE_ROWS_MULTIPLE * _TILE_ROWS_MULTIPLE)
    if device is not None and device.type != "cpu":
        tile = block  # a GPU unpacks whole blocks: small tiles would only add kernel launches
    out = []
    for a in range(0, rows, block):
        b = min(rows, a + block)
        while b - a >= 2 * tile:
            out.append((a, a + tile))
            a += tile
        out.append((a, b))
    return out


class _Scratch(threading.local):
    """Per thread: the float32 buffer every packed matmul tile of this thread is unpacked into."""

    buf: torch.Tensor | None = None

    def get(self, numel: int) -> torch.Tensor:
        if self.buf is None or self.buf.numel() < numel:
            with torch.inference_mode(False):  # a normal tensor: written in and out of inference mode alike
                self.buf = torch.empty(numel, dtype=torch.float32)
        return self.buf[:numel]


_SCRATCH = _Scratch()


def run_tiles(tiles: list[tuple[int, int]], in_features: int,
              run: Callable[[int, int, torch.Tensor], None]) -> None:
    """``run(a, b, buffer)`` for every CPU tile, with torch on one intra-op thread meanwhile.

    A tile's matmul is short and alternates with numpy's dequantization; OpenMP's workers spin between
    such calls and, on a shared 2-core machine, made the whole parity run 3–25× slower than one thread
    (benchmarks/PERFORMANCE.md). A pool of Python workers each taking tiles gained nothing there and
    cost memory (a buffer and an allocator arena per thread). One thread gives the same floats: each tile
    is still one matmul call."""
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        for a, b in tiles:
            run(a, b, _SCRATCH.get((b - a) * in_features))
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


def unpack_rows(data: torch.Tensor, ggml_type: Any, shape: tuple[int, int], *,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 rows as a file stores them (BF16, F16, F32 or ggml blocks) -> float32 ``shape``, exactly.

    ``out`` (a contiguous float32 CPU tensor of ``shape``'s size) receives the values instead of a new tensor."""
    name = getattr(ggml_type, "name", str(ggml_type))
    data = data.contiguous()
    if out is not None:
        if data.device.type != "cpu":
            out = None
        else:
            out = out.view(shape)
    if name in FLOAT_VIEWS:
        src = data.view(FLOAT_VIEWS[name]).reshape(shape)
        return src.to(torch.float32) if out is None else out.copy_(src)  # widening: exact either way
    if data.device.type != "cpu":  # dequantize on the device itself
        try:
            from ..kernels import dequantize_torch
            from ..kernels.reference import TORCH_DEQUANT

            if ggml_type in TORCH_DEQUANT:
                return dequantize_torch(data, ggml_type, shape)
        except ImportError:
            pass
    # on the CPU: the codecs' dequantizers (bit for bit gguf.quants.dequantize's values); into ``out`` without
    # a temporary for Q8_0

    if out is not None and ggml_type in QUANT_TYPES:
        dequantize_into(data.numpy(), ggml_type, out.numpy())
        return out
    return torch.from_numpy(to_float32(data.cpu().numpy(), name, shape)).to(data.device)


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
    ``head_dim``: a ``partial_rotary_factor`` in the config does not change it, so it does not here.
    """

    def __init__(self, head_dim: int, theta: float, scaling: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.scaling = dict(scaling) if scaling else None

    def inv_freq(self) -> tuple[torch.Tensor, float]:
        """(inverse frequencies [head_dim / 2], factor applied to cos/sin)."""
        dim = self.head_dim
        pos_freqs = self.theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
        inv_freq = 1.0 / pos_freqs
        kind = (self.scaling or {}).get("rope_type", "default")
        if kind == "linear":
            return inv_freq / float(self.scaling["factor"]), 1.0  # type: ignore[index]
        if kind != "yarn":
            return inv_freq, 1.0
        p = self.scaling or {}
        factor = float(p["factor"])
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
    """RoPE; ``cos``/``sin`` cover context + noise, the queries (noise only) take the last ``q_len``."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q_len = q.shape[-2]
    q = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
    k = k * cos + rotate_half(k) * sin
    return q, k


def attention_mask(q_len: int, k_len: int, *, causal: bool, window: int | None, device: torch.device,
                   window_from_anchor: bool = False) -> torch.Tensor:
    """Boolean ``[1, 1, q_len, k_len]`` visibility; queries are the last ``q_len`` key positions.

    ``window_from_anchor`` (speculators' ``create_anchor_block_mask_mod``): the block sees the ``window``
    context positions before the anchor (the block's first position) and the block itself.
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
        if not causal:
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
        if self.window_from_anchor:  # speculators: full layers bidirectional, sliding ones causal unless told
            self.causal = sliding and not getattr(spec, "sliding_window_non_causal", False)
        else:  # z-lab: sliding layers are causal, full ones are not, unless is_causal says otherwise.
            self.causal = sliding if spec.causal is None else bool(spec.causal)
        self.window = spec.sliding_window if sliding else None
        # Interleaved-RoPE checkpoints (HF layout): q/k go to NeoX order before RoPE (see `neox_order`).
        self.register_buffer("rope_order", neox_order(hd) if getattr(spec, "rope_interleaved", False) else None,
                             persistent=False)
        self.register_buffer("sinks", None)  # [n_heads] attention-sink logits (gpt-oss / MiMo), when present

    def forward(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: DraftCache | None) -> torch.Tensor:
        b, q_len, _ = x.shape
        ctx_len = context.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, q_len, -1, self.head_dim)).transpose(1, 2)
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
                                  window_from_anchor=self.window_from_anchor)
        if self.sinks is not None:
            out = sink_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), mask, self.sinks, self.scaling)
        elif mask is not None:
            out = F.scaled_dot_product_attention(
                q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), attn_mask=mask, scale=self.scaling
            )
        else:
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scaling, enable_gqa=self.n_rep > 1)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


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

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.fc = Linear(spec.fc_input_width, h)
        self.hidden_norm = RMSNorm(h, spec.rms_norm_eps)
        self.layers = nn.ModuleList(self.layer_class(spec, i) for i in range(spec.n_layers))
        self.norm = RMSNorm(h, spec.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(spec.head_dim, spec.rope_theta, rope_parameters(spec.rope_scaling))
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
        """0 when slot 0 predicts (``sample_from_anchor``), else 1 (slot 0 is the anchor)."""
        return 0 if getattr(self.spec, "sample_from_anchor", False) else 1

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

    def compute_logits(self, hidden: torch.Tensor, head: TargetHead | nn.Module) -> torch.Tensor:
        """Target ``lm_head`` (or the drafter's own) × output multiplier, then final logit softcapping (if
        configured). Rows are the drafter's vocabulary: `to_target_vocab` maps them through ``d2t``."""
        logits = (self.lm_head if self.lm_head is not None else head)(hidden)
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


# ---------------------------------------------------------------------------------------------
# Sampling (the reference's temperature path; greedy needs none of it)
# ---------------------------------------------------------------------------------------------


def sampling_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample_probs(probs: torch.Tensor) -> torch.Tensor:
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).view(probs.shape[:-1])
