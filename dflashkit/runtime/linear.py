"""The runtime's linear layer and the ways it holds its weight: dense, ggml-quantized, or packed.

A drafter's matrices load in one of three forms (`dflashkit.runtime.load` picks one): a dense float buffer, ggml
blocks kept quantized and multiplied by ``dflashkit.runtime.kernels.qmatmul``, or the file's own bytes (BF16/F16/ggml
blocks) unpacked to float32 at each forward, row block by row block (`packed_tiles`, `run_tiles`, `unpack_rows`).
The packed form's knobs (``PACKED_BLOCK_BYTES``, ``PACKED_TILE_BYTES``) are read here, so they are set here.

Apart from the layers (`blocks`) and the model (`dflash`) because how a weight is stored and unpacked is its own
concern — and the one place the float32 rounding of a blocked matmul is decided.
"""

from __future__ import annotations

import mmap
import threading
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from ..codecs import QUANT_TYPES, dequantize_into, to_float32
from .ggml_rounding import round_activations, round_q8_1
from .kernels.reference import FLOAT_VIEWS


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with W dense (a float buffer) or ggml-quantized (uint8 blocks + type).

    Quantized weights stay quantized in memory and run through ``dflashkit.runtime.kernels.qmatmul``.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", None)
        self.register_buffer("bias", None)
        self.register_buffer("qdata", None)  # uint8 [out_features, row_bytes] when quantized
        self.ggml_type: Any = None
        self.packed = False  # qdata holds the file's bytes, unpacked to float32 at each forward
        self.file_map: mmap.mmap | None = None  # the private file map qdata is a view of (`release`)
        # a llama.cpp GGUF's weight: the type ggml rounds the activations to before multiplying (`ggml_rounding`),
        # and a Q4_1 / Q5_1 weight's block minimums [out_features, in_features / 32] its Q8_1 block sums meet
        self.activation_type: str | None = None
        self.block_mins: torch.Tensor | None = None

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

    def forward_many(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """``forward`` of each ``x``, a packed weight unpacked once for all of them: each ``x`` meets the same tiles
        in the same calls as alone, so the same floats (a vocabulary projection of several rounds, one pass)."""
        if self.activation_type is not None or not (self.qdata is not None and self.packed) or any(
                x.device.type != "cpu" or (x.requires_grad and torch.is_grad_enabled()) for x in xs):
            return [self(x) for x in xs]
        outs: list[list[torch.Tensor]] = [[] for _ in xs]

        def run(a: int, b: int, buf: torch.Tensor) -> None:
            w = unpack_rows(self.qdata[a:b], self.ggml_type, (b - a, self.in_features), out=buf)
            for out, x in zip(outs, xs):
                out.append(F.linear(x, w.to(x.dtype), None if self.bias is None else self.bias[a:b]))

        run_tiles(packed_tiles(self.out_features, self.in_features, xs[0].device), self.in_features, run)
        return [o[0] if len(o) == 1 else torch.cat(o, dim=-1) for o in outs]

    def release(self) -> None:
        """Drop the pages of a weight read through a file map (``file_map``, `runtime.load`'s ``mapped``) from this
        process; the map stays valid and reads them again from the page cache."""
        if self.file_map is not None:
            try:
                self.file_map.madvise(mmap.MADV_DONTNEED)
            except (AttributeError, OSError, ValueError):  # a platform without madvise: the pages stay
                pass

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
        if self.activation_type is None:
            return self._forward(x)
        if self.block_mins is None:
            return self._forward(round_activations(x, self.activation_type).to(x.dtype))
        rounded, correction = round_q8_1(x)  # one quantization of x for both terms
        y = self._forward(rounded.to(x.dtype))
        return y + correction.to(y.dtype) @ self.block_mins.to(y.dtype).T

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qdata is not None and self.packed:
            return self._packed_forward(x)
        if self.qdata is not None:
            from .kernels import QuantizedWeight, qmatmul  # only reached when the loader found them

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
            from .kernels import dequantize_torch
            from .kernels.reference import TORCH_DEQUANT

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
