"""``qmatmul``: x @ W.T with W kept quantized, on the fastest path this device has.

- CUDA: the Triton fused kernel (Q8_0, Q4_K, Q6_K);
- MPS: the Metal fused matrix-vector (same types);
- anything else, or a type / dtype those kernels lack: the reference path, which dequantizes the weight with
  ``dequantize_torch`` on its device and multiplies in float32.

When a CUDA or MPS device has to fall back (triton missing, shader unavailable), a one-line notice is issued
once per process through ``warnings.warn`` (RuntimeWarning). ``qmatmul_path`` says which path runs, so parity
reports can name it.
"""

from __future__ import annotations

import threading
import warnings

import torch

from dflashkit.errors import DFlashError
from dflashkit.quant_types import is_quantized

from . import metal, triton_kernels
from .weight import QuantizedWeight

PATHS = ("triton", "metal", "reference")
_notified: set[str] = set()
_lock = threading.Lock()


def _notice(key: str, message: str) -> None:
    """Warn once per process per ``key`` (one line)."""
    with _lock:
        if key in _notified:
            return
        _notified.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def reset_notices() -> None:
    """Forget which fallback notices were issued (tests)."""
    with _lock:
        _notified.clear()


def _triton_missing() -> str | None:
    if triton_kernels.installed():
        return None
    return ("dflashkit.runtime.kernels: triton is not installed, so quantized matmuls on CUDA use the slower reference path "
            "(pip install 'dflashkit[triton]')")


def _metal_missing() -> str | None:
    ok, why = metal.available()
    return None if ok else f"dflashkit.runtime.kernels: Metal kernels unavailable ({why}); using the reference path"


#: device type → (its fused path, the kernels' module, their name in a notice, where a notice says the matmul runs,
#: why the path cannot run here: None when it can)
_FUSED = {
    "cuda": ("triton", triton_kernels, "Triton", "on CUDA ", _triton_missing),
    "mps": ("metal", metal, "Metal", "", _metal_missing),
}


def qmatmul_path(x_device: torch.device | str, w: QuantizedWeight) -> str:
    """"triton" | "metal" | "reference": the path ``qmatmul`` uses for activations on ``x_device``
    (float16 / bfloat16 / float32 activations; others always take the reference path)."""
    fused = _FUSED.get(torch.device(x_device).type)
    if fused is None:
        return "reference"
    path, kernels, kernels_name, where, missing = fused
    if w.ggml_type not in kernels.SUPPORTED_TYPES:
        if is_quantized(w.ggml_type):
            _notice(f"{path}-{w.ggml_type.name}", f"dflashkit.runtime.kernels: no {kernels_name} kernel for "
                    f"{w.ggml_type.name}, so its matmuls {where}dequantize, then multiply (the reference path)")
        return "reference"
    why = missing()
    if why is not None:
        _notice(path, why)
        return "reference"
    return path


def reference_qmatmul(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """Dequantize W to float32 on its device, then ``x @ W.T`` in float32 (float64 for float64 x)."""
    compute = torch.promote_types(x.dtype, torch.float32)
    wt = w.dequantize()
    if compute != torch.float32:
        wt = wt.to(compute)
    return torch.matmul(x.to(compute), wt.t()).to(x.dtype)


def qmatmul(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """``x [..., in_features] -> [..., out_features] = x @ W.T`` with W expanded on the fly; result in x.dtype."""
    if not isinstance(w, QuantizedWeight):
        raise DFlashError(f"qmatmul needs a QuantizedWeight, got {type(w).__name__}")
    if not x.is_floating_point():
        raise DFlashError(f"qmatmul needs floating-point activations, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != w.in_features:
        raise DFlashError(f"qmatmul: activations of shape {tuple(x.shape)} do not match a {w.ggml_type.name} "
                          f"weight of shape {w.shape} (need [..., {w.in_features}])")
    if x.device != w.device:
        raise DFlashError(f"qmatmul: activations on {x.device} but the weight on {w.device} "
                          f"(move it with QuantizedWeight.to)")
    path = qmatmul_path(x.device, w)
    if path == "triton" and x.dtype in triton_kernels.ACTIVATION_DTYPES:
        return triton_kernels.qmatmul_triton(x, w)
    if path == "metal" and x.dtype in triton_kernels.ACTIVATION_DTYPES:
        return metal.qmatmul_metal(x, w)
    return reference_qmatmul(x, w)
