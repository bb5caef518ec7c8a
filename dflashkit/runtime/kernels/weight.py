"""QuantizedWeight: a linear layer's weight kept as raw ggml blocks on the device that multiplies it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError

from .reference import dequantize_torch, get_dequant


@dataclass(frozen=True)
class QuantizedWeight:
    """``data``: uint8 ``[out_features, row_bytes]`` raw ggml blocks; ``shape``: ``(out_features, in_features)``,
    the nn.Linear / HF layout (GGUF lists it reversed: ne0 = in_features is the row length)."""

    data: torch.Tensor
    ggml_type: GGMLQuantizationType
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        dq = get_dequant(self.ggml_type)
        object.__setattr__(self, "ggml_type", dq.ggml_type)
        if len(self.shape) != 2:
            raise DFlashError(f"QuantizedWeight shape must be (out_features, in_features), got {self.shape!r}")
        out_f, in_f = (int(s) for s in self.shape)
        object.__setattr__(self, "shape", (out_f, in_f))
        rb = dq.row_bytes(in_f)
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (out_f, rb):
            raise DFlashError(f"{dq.name} weight {self.shape}: data must be uint8 [{out_f}, {rb}], "
                              f"got {self.data.dtype} {list(self.data.shape)}")

    @classmethod
    def from_numpy(cls, raw: np.ndarray, ggml_type: GGMLQuantizationType | int | str, shape: Sequence[int],
                   device: torch.device | str = "cpu") -> "QuantizedWeight":
        """Wrap the raw bytes of a GGUF tensor (any dtype / shape holding exactly those bytes, e.g. gguf-py's
        ``ReaderTensor.data``). Read-only or strided arrays (memory maps) are copied; others are shared on CPU."""
        dq = get_dequant(ggml_type)
        if len(shape) != 2:
            raise DFlashError(f"QuantizedWeight shape must be (out_features, in_features), got {tuple(shape)!r}")
        out_f, in_f = (int(s) for s in shape)
        rb = dq.row_bytes(in_f)
        arr = np.asarray(raw)
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            arr = np.array(arr, order="C", copy=True)  # torch.from_numpy needs a writable buffer
        arr = arr.reshape(-1).view(np.uint8)
        if arr.size != out_f * rb:
            raise DFlashError(f"{dq.name} weight of shape ({out_f}, {in_f}) needs {out_f * rb} bytes, "
                              f"got {arr.size}")
        return cls(torch.from_numpy(arr.reshape(out_f, rb)).to(device), dq.ggml_type, (out_f, in_f))

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def row_bytes(self) -> int:
        return int(self.data.shape[1])

    @property
    def device(self) -> torch.device:
        return self.data.device

    def to(self, device: torch.device | str) -> "QuantizedWeight":
        """The same blocks on ``device``."""
        return QuantizedWeight(self.data.to(device), self.ggml_type, self.shape)

    def dequantize(self) -> torch.Tensor:
        """float32 ``[out_features, in_features]`` on the weight's device, bit-identical to gguf-py."""
        return dequantize_torch(self.data, self.ggml_type, self.shape)
