"""The activations of a matmul as ggml's CPU backend rounds them, so a llama.cpp GGUF runs as llama.cpp runs it.

ggml's CPU ``mul_mat`` never multiplies a weight with float32 activations unless the weight is F32: it first converts
the activation row to the weight type's ``vec_dot_type`` (``type_traits_cpu`` in ``ggml-cpu/ggml-cpu.c``) and takes
the dot product of the two. An F16 weight meets F16 activations, BF16 meets BF16, Q4_0 / Q5_0 / Q8_0 / IQ4_NL meet
Q8_0 blocks (32 values, one F16 scale), Q4_1 / Q5_1 meet Q8_1 (Q8_0 plus an F16 block sum ``s``) and every K-quant
and IQ4_XS meets Q8_K (256 values, one F32 scale). The integer products are exact, so what llama.cpp computes is —
within float32 summation order — the float dot product of the dequantized weight with the *rounded* activations
given here (`round_activations`), plus, for Q8_1, the term its F16 block sum adds (`round_q8_1`).

Written in torch (vectorized over rows and blocks) from the quantizers themselves, because no library exposes
ggml's activation formats: ``quantize_row_q8_0`` / ``quantize_row_q8_1`` of ``ggml-cpu/arch/x86/quants.c`` (scale
``max|x| / 127`` stored as F16, ``x · 127 / max|x|`` rounded half to even by ``_mm256_round_ps``; Q8_1's ``s`` is
``F16(d · Σq)``) and ``quantize_row_q8_K_ref`` of ``ggml-quants.c`` (``iscale = −127 / x[argmax|x|]``, the first
such x; ``nearest_int`` rounds half to even; ``q ≤ 127``; the scale ``1 / iscale`` kept in F32). The F16 and BF16
conversions round to nearest even, as ``GGML_CPU_FP32_TO_FP16`` (F16C) and ``GGML_FP32_TO_BF16`` do.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

#: a stored weight type → the type ggml's CPU backend converts the activations to (``vec_dot_type``); a type
#: not listed (F32, and I32/I64 that are never multiplied) keeps float32 activations
VEC_DOT_TYPES: dict[str, str] = {
    "F16": "F16", "BF16": "BF16",
    "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "IQ4_NL": "Q8_0", "MXFP4": "Q8_0",
    "Q4_1": "Q8_1", "Q5_1": "Q8_1",
    "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K", "IQ4_XS": "Q8_K",
    "IQ2_XXS": "Q8_K", "IQ2_XS": "Q8_K", "IQ2_S": "Q8_K", "IQ3_XXS": "Q8_K", "IQ3_S": "Q8_K", "IQ1_S": "Q8_K",
    "IQ1_M": "Q8_K", "TQ1_0": "Q8_K", "TQ2_0": "Q8_K",
}


def vec_dot_type(weight_type: str) -> str | None:
    """The activation type ggml multiplies a ``weight_type`` weight with (None: float32, no rounding)."""
    return VEC_DOT_TYPES.get(weight_type.upper())


def _blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.shape[-1] % size:
        raise ValueError(f"a row of {x.shape[-1]} values is not whole blocks of {size}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def _q8_0(xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, the float32 scale d, the scale as stored in F16) of Q8_0 / Q8_1 blocks ``xb`` [..., 32]."""
    amax = xb.abs().amax(dim=-1, keepdim=True)
    d = amax / 127.0
    # (a tensor divides a tensor: torch computes ``scalar / tensor`` as ``scalar * (1 / tensor)``, an ulp off C's)
    inv = torch.where(amax != 0, torch.full_like(amax, 127.0) / torch.where(amax != 0, amax, torch.ones_like(amax)),
                      torch.zeros_like(amax))
    q = torch.round(xb * inv)  # half to even, as _mm256_round_ps(_MM_ROUND_NEAREST)
    return q, d, d.to(torch.float16).to(torch.float32)


def _q8_k(xb: torch.Tensor) -> torch.Tensor:
    """Q8_K blocks ``xb`` [..., 256] dequantized (``quantize_row_q8_K_ref``)."""
    idx = xb.abs().argmax(dim=-1, keepdim=True)  # the first of equal magnitudes, as its strict ">" loop keeps
    peak = torch.gather(xb, -1, idx)
    zero = peak == 0
    iscale = torch.full_like(peak, -127.0) / torch.where(zero, torch.ones_like(peak), peak)
    q = torch.round(iscale * xb).clamp(max=127.0)  # nearest_int: half to even
    return torch.where(zero, torch.zeros_like(xb), q * (torch.ones_like(iscale) / iscale))


def round_activations(x: torch.Tensor, kind: str | None) -> torch.Tensor:
    """``x`` (float32, [..., K]) as ggml's CPU backend converts it to ``kind`` (a `vec_dot_type`), back in float32:
    what the weight is actually multiplied with. ``kind`` None or F32: ``x`` unchanged."""
    if kind is None or kind == "F32":
        return x
    xf = x.to(torch.float32)
    if kind == "F16":
        return xf.to(torch.float16).to(torch.float32)
    if kind == "BF16":
        return xf.to(torch.bfloat16).to(torch.float32)
    if kind in ("Q8_0", "Q8_1"):
        q, _, d16 = _q8_0(_blocks(xf, 32))
        return (q * d16).reshape(xf.shape)
    if kind == "Q8_K":
        return _q8_k(_blocks(xf, 256)).reshape(xf.shape)
    raise ValueError(f"no activation rounding for {kind}")


def round_q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``round_activations(x, "Q8_1")``, the block-sum correction [..., K/32]) from one quantization of ``x``.

    The correction is the block sum ggml multiplies a Q4_1 / Q5_1 weight's minimum with (``F16(d · Σq)``), less
    the sum of the rounded activations (``F16(d) · Σq``) that the dequantized weight's dot product already counts:
    ``y = rounded · W + correction · mins`` is ggml's dot product."""
    xf = x.to(torch.float32)
    q, d, d16 = _q8_0(_blocks(xf, 32))
    total = q.sum(dim=-1)
    correction = (d.squeeze(-1) * total).to(torch.float16).to(torch.float32) - d16.squeeze(-1) * total
    return (q * d16).reshape(xf.shape), correction


def round_as_ggml(module: Any, type_name: str, raw: Callable[[], Any], device: torch.device) -> None:
    """Make the runtime's ``Linear`` ``module`` (its weight stored as ``type_name``, ``raw()`` its bytes) multiply as
    ggml's CPU backend does: the activations rounded to the weight's ``vec_dot_type``, and for Q4_1 / Q5_1 the block
    minimums (the F16 at bytes 2–3 of every block) that its Q8_1 block sums meet."""
    module.activation_type = vec_dot_type(type_name)
    if module.activation_type == "Q8_1":
        block = GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]][1]
        blocks = np.asarray(raw(), dtype=np.uint8).reshape(module.out_features, -1, block)
        mins = blocks[:, :, 2:4].copy().view(np.float16)[..., 0]
        module.block_mins = torch.from_numpy(mins.astype(np.float32)).to(device)
