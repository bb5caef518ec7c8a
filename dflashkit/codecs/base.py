"""QuantType base class, the registry, input checks and the row-chunk thread pool.

Organised like gguf-py's ``gguf/quants.py``: one small class per ggml type with block-level ``quantize_blocks`` /
``dequantize_blocks``, sizes from ``gguf.GGML_QUANT_SIZES``, and row-level wrappers shared here.
"""

from __future__ import annotations

import itertools
import os
import threading
import concurrent.futures
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
from gguf import GGMLQuantizationType

from dflashkit.errors import DFlashError
from dflashkit.files import signals_deferred
from dflashkit.quant_types import FileType, sizes

QUANT_TYPES: dict[GGMLQuantizationType, "QuantType"] = {}

# ----------------------------------------------------------------------------------------- threads
# Rows (and blocks) are independent, so large inputs are split into contiguous block ranges and the numba
# kernels (nogil) run on a shared pool. Small inputs stay on the calling thread: pool hand-off costs more.
_MIN_ELEMS_PER_THREAD = 1 << 16
_num_threads: int | None = None
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _default_threads() -> int:
    env = os.environ.get("DFLASHKIT_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise DFlashError(f"DFLASHKIT_THREADS must be a positive integer, got {env!r}") from None
        if n < 1:
            raise DFlashError(f"DFLASHKIT_THREADS must be a positive integer, got {env!r}")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def get_num_threads() -> int:
    """Threads used for large inputs: set_num_threads(), else $DFLASHKIT_THREADS, else the usable CPU count."""
    return _num_threads if _num_threads is not None else _default_threads()


def set_num_threads(n: int | None) -> None:
    """Set the thread count for quantization (None restores the default)."""
    global _num_threads
    if n is not None and (not isinstance(n, int) or n < 1):
        raise DFlashError(f"thread count must be a positive integer, got {n!r}")
    _num_threads = n


def _get_pool(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < n:
            # the old pool is not shut down (another caller may still be submitting to it); its idle
            # workers exit once it is garbage collected
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="dflashkit-quant")
            _pool_size = n
        return _pool


def run_chunked(kernel: Callable[[np.ndarray, np.ndarray], Any], x: np.ndarray, out: np.ndarray,
                threads: int | None = None, elems_per_row: int = 1,
                min_elems_per_thread: int = _MIN_ELEMS_PER_THREAD) -> None:
    """Run ``kernel(x[a:b], out[a:b])`` over contiguous ranges of the first axis, in parallel when large.

    ``elems_per_row`` (element count times a relative cost) over ``min_elems_per_thread`` bounds how many
    threads are worth starting. Work is cut into up to 4 chunks per thread and handed out dynamically, so a
    core slowed by other load does not hold the rest back.
    """
    n = x.shape[0]
    if n == 0:
        return
    want = get_num_threads() if threads is None else threads
    if not isinstance(want, (int, np.integer)) or want < 1:
        raise DFlashError(f"thread count must be a positive integer, got {threads!r}")
    by_size = max(1, (n * elems_per_row) // min_elems_per_thread)
    k = int(min(want, by_size, n))
    if k == 1:
        kernel(x, out)
        return
    n_chunks = int(min(n, by_size, 4 * k))
    bounds = np.linspace(0, n, n_chunks + 1).astype(np.int64).tolist()
    next_chunk = itertools.count()
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set() and (i := next(next_chunk)) < n_chunks:
            a, b = bounds[i], bounds[i + 1]
            if b > a:
                kernel(x[a:b], out[a:b])

    with signals_deferred():  # a Ctrl-C inside submit would leave the executor's global lock held (exit hangs)
        pool = _get_pool(k)
        futures = [pool.submit(worker) for _ in range(k)]
    try:
        for f in futures:
            f.result()
    except BaseException:
        # Ctrl-C or a failed chunk: no worker takes another chunk. Those running finish first (they read and
        # write the caller's buffers, a map the caller is about to close); the pool's idle workers are joined at
        # exit at once. Without the flag they went on through every chunk left, and exit waited for them.
        stop.set()
        concurrent.futures.wait(futures)
        raise


# ----------------------------------------------------------------------------------------- input checks
def tensor_nbytes(ggml_type: GGMLQuantizationType, shape: Sequence[int]) -> int:
    """Bytes of a tensor of ``ggml_type`` with numpy-order ``shape`` (row length last; GGUF's ne0).
    The row length must be a multiple of the type's block size (DFlashError otherwise)."""
    block, type_size = sizes(ggml_type)
    if len(shape) and shape[-1] % block:
        raise DFlashError(
            f"row length {shape[-1]} is not a multiple of {GGMLQuantizationType(ggml_type).name}'s block size {block}"
        )
    n = 1
    for d in shape:  # Python ints: no overflow whatever a header claims
        n *= int(d)
    return n // block * type_size


def as_float32(x: Any) -> np.ndarray:
    """Float input as a float32 ndarray (torch tensors, incl. bf16, converted exactly on the host)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor without importing torch
        t = x.detach().cpu()
        if str(t.dtype) != "torch.float32":
            t = t.float()  # bf16 / f16 widen exactly
        x = t.numpy()
    x = np.asarray(x)
    if x.dtype != np.float32:
        if not np.issubdtype(x.dtype, np.floating):
            raise DFlashError(f"can only quantize floating-point data, got dtype {x.dtype}")
        x = x.astype(np.float32)
    return x


class BlockFormat:
    """A ggml block format: its sizes and row checks, the base of every per-type class (the types' modules in
    ``codecs/types``; the runtime's torch dequantizer of each wraps one): ``class X(Family, ggml_type=...)`` takes
    ``block_size`` / ``type_size`` from ``gguf.GGML_QUANT_SIZES`` and registers an instance in ``Family.registry``."""

    registry: ClassVar[dict[GGMLQuantizationType, Any]]
    ggml_type: ClassVar[GGMLQuantizationType]
    block_size: ClassVar[int]
    type_size: ClassVar[int]

    def __init_subclass__(cls, ggml_type: GGMLQuantizationType | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if ggml_type is None:
            return
        cls.ggml_type = ggml_type
        cls.block_size, cls.type_size = sizes(ggml_type)
        assert ggml_type not in cls.registry, ggml_type
        cls.registry[ggml_type] = cls()

    @property
    def name(self) -> str:
        return self.ggml_type.name

    row_verb: ClassVar[str] = "quantize to"  # for the row-length error message

    def check_row_length(self, n: int) -> None:
        if n <= 0 or n % self.block_size != 0:
            raise DFlashError(
                f"cannot {self.row_verb} {self.name}: row length {n} is not a positive multiple of "
                f"{self.block_size} (the {self.name} block size)")

    def row_bytes(self, n: int) -> int:
        """Bytes of one row of ``n`` values."""
        self.check_row_length(n)
        return n // self.block_size * self.type_size


class QuantType(BlockFormat):
    """One ggml tensor type: block-level quantize / dequantize plus row-level wrappers, registered
    in ``QUANT_TYPES`` (``class Q4_K(QuantType, ggml_type=...)``)."""

    registry = QUANT_TYPES
    #: quantizing runs numba code (`preload_quantizers` loads numba early only for these types)
    needs_numba: ClassVar[bool] = False
    #: the llama.cpp file types whose default type this is (`dflashkit.filetypes` gathers every type's)
    file_types: ClassVar[tuple[FileType, ...]] = ()
    #: tensor_type_fallback: the type a tensor takes whose row length does not fit this block (None: no fallback)
    fallback: ClassVar[GGMLQuantizationType | None] = None
    #: byte offsets of the block's fp16 scales (`d`, and `m` / `dmin` where present): a block's values are
    #: non-finite exactly when one of them is (the values scan, the runtime's kernel tests)
    fp16_fields: ClassVar[tuple[int, ...]] = ()

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        """The runtime's dequantizer: torch uint8 ``blocks`` [n_blocks, type_size] (any device) into ``out``
        float32 [n_blocks, block_size], bit-identical to `dequantize_blocks` (the same float32 operations in the
        same order). ``ops`` is the runtime's module of torch block helpers (``ops.torch``, ``ops.nibbles``,
        ``ops.scaled``, ...: ``dflashkit.runtime.kernels.reference``), passed in so a codec never imports torch."""
        raise NotImplementedError(f"{self.name} has no torch dequantizer")

    def __init_subclass__(cls, **kw: Any) -> None:
        # the facts a type states in its class line: ``class Q4_K(KernelQuantType, ggml_type=..., fallback=...)``
        for fact in ("fallback", "fp16_fields", "kind"):
            if fact in kw:
                setattr(cls, fact, kw.pop(fact))
        super().__init_subclass__(**kw)

    @property
    def rank(self) -> int:
        """Where the type stands in the lists a user reads (larger first): its highest file type's (`FileType.rank`,
        about ten times its bits per weight); 0 for a type no file type defaults to."""
        return max((ft.rank for ft in self.file_types), default=0)

    @property
    def has_torch_dequantizer(self) -> bool:
        return type(self).dequantize_torch is not QuantType.dequantize_torch

    @property
    def uses_weights(self) -> bool:
        """ggml quantizes this type with importance weights when it is given them (Q8_0 and the float types
        ignore them)."""
        return False

    def __repr__(self) -> str:
        return f"<QuantType {self.name}: {self.block_size} values -> {self.type_size} bytes>"

    # --- blocks (override) ---------------------------------------------------------------------------
    def quantize_blocks(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        """float32 [n_blocks, block_size] -> uint8 [n_blocks, type_size]."""
        raise NotImplementedError

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        """uint8 [n_blocks, type_size] -> float32 [n_blocks, block_size]."""
        raise NotImplementedError

    def quantize_rows_weighted(self, x: np.ndarray, imatrix: np.ndarray, threads: int | None = None) -> np.ndarray:
        """float32 [rows, n] with one importance weight per column (``imatrix`` [n]) -> uint8 [rows, row_bytes]:
        ggml_quantize_chunk with ``quant_weights``. A type ggml quantizes without weights ignores them (Q8_0, the
        float types), as ggml does."""
        return self.quantize_blocks(x.reshape(-1, self.block_size), threads=threads).reshape(x.shape[0], -1)

    def quantize_rows_into(self, x: np.ndarray, out: np.ndarray, imatrix: np.ndarray | None) -> None:
        """float32 rows ``x`` [rows, n] (C-contiguous) quantized on the calling thread into ``out`` [rows,
        row_bytes]: the step of `quantize_f16_rows` that runs beside the decode (override: without a temporary)."""
        out[...] = self.quantize(x, threads=1, imatrix=imatrix)

    # --- rows ------------------------------------------------------------------------------------------
    def quantize(self, x: Any, threads: int | None = None, imatrix: Any = None) -> np.ndarray:
        """float (..., n) -> uint8 (..., n // block_size * type_size), bytes identical to ggml's reference
        (``ggml_quantize_chunk``); with ``imatrix`` (float32 [n], one weight per column) its weighted quantizer."""
        x = as_float32(x)
        if x.ndim == 0:
            raise DFlashError(f"cannot quantize a scalar to {self.name}: need shape (..., n)")
        n = x.shape[-1]
        rb = self.row_bytes(n)
        lead = x.shape[:-1]
        if imatrix is not None:
            qw = np.ascontiguousarray(imatrix, dtype=np.float32)
            if qw.shape != (n,):
                raise DFlashError(f"cannot quantize to {self.name} with an importance matrix of shape {qw.shape}: "
                                  f"need one weight per column ({n})")
            rows = np.ascontiguousarray(x).reshape(-1, n)
            return self.quantize_rows_weighted(rows, qw, threads=threads).reshape(*lead, rb)
        blocks = np.ascontiguousarray(x).reshape(-1, self.block_size)
        return self.quantize_blocks(blocks, threads=threads).reshape(*lead, rb)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """uint8 (..., row_bytes) -> float32 (..., n)."""
        q = np.asarray(q)
        if q.ndim == 0:
            raise DFlashError(f"cannot dequantize a scalar as {self.name}: need shape (..., row_bytes)")
        if q.dtype != np.uint8:
            q = np.ascontiguousarray(q).view(np.uint8)
        nb = q.shape[-1]
        if nb <= 0 or nb % self.type_size != 0:
            raise DFlashError(
                f"cannot dequantize {self.name}: row of {nb} bytes is not a positive multiple of "
                f"{self.type_size} (the {self.name} block bytes)")
        lead = q.shape[:-1]
        blocks = np.ascontiguousarray(q).reshape(-1, self.type_size)
        return self.dequantize_blocks(blocks).reshape(*lead, nb // self.type_size * self.block_size)

    def dequantize_blocks_into(self, q: np.ndarray, out: np.ndarray) -> None:
        """`dequantize_blocks` written into ``out`` float32 [n_blocks, block_size] (override: without temporaries)."""
        out[...] = self.dequantize_blocks(q)

    def dequantize_into(self, q: np.ndarray, out: np.ndarray) -> np.ndarray:
        """uint8 (..., row_bytes) -> ``out`` (float32, C-contiguous, as many values as ``q`` encodes): the values
        of `dequantize`, for callers that dequantize the same weights again and again into one buffer (the
        runtime's packed matmuls). Q8_0 writes straight into ``out``; other types still build the float32 array."""
        q = np.asarray(q)
        if q.dtype != np.uint8:
            q = np.ascontiguousarray(q).view(np.uint8)
        n_values = q.size // self.type_size * self.block_size
        if q.ndim == 0 or q.shape[-1] % self.type_size or out.dtype != np.float32 or not out.flags.c_contiguous \
                or out.size != n_values:
            raise DFlashError(f"cannot dequantize {self.name} into a {out.dtype} array of {out.size} values: need "
                              f"C-contiguous float32 of {n_values} values and rows of whole {self.type_size}-byte blocks")
        self.dequantize_blocks_into(np.ascontiguousarray(q).reshape(-1, self.type_size), out.reshape(-1, self.block_size))
        return out


class _LazyKernels:
    """``loops`` imported on first use: importing numba and loading its cached kernels costs about a second,
    which inspect / diff / dequantizing never need (only quantizing and f32 -> f16/bf16 run numba code)."""

    def __getattr__(self, name: str) -> Any:
        from . import loops

        return getattr(loops, name)


#: the numba kernels, for the codec modules (``K.legacy_kernel``): attribute access imports them
K = _LazyKernels()


class KernelQuantType(QuantType):
    """A type whose quantize_blocks is one kernel ``(x [n_blocks, block_size], out [n_blocks, type_size])`` run
    on row chunks across threads: ``_kernel`` (set by the subclass) is a numba kernel's name in ``loops``, that name
    with the extra arguments it takes after ``x`` and ``out`` (``("qk_kernel", (15, …))``), or a function (one that
    calls kernels itself, or Q8_0's numpy quantizer: ``needs_numba = False``)."""

    _kernel: ClassVar[str | tuple[str, tuple[Any, ...]] | Callable[[np.ndarray, np.ndarray], None]]
    #: the importance-weighted row kernel, ``(name in loops or a function, extra arguments)``: ``kernel(x[rows,
    #: n], qw[n], out[rows, row_bytes], *extra)``; None where ggml takes no weights
    _weighted: ClassVar[tuple[str | Callable[..., Any], tuple[Any, ...]] | None] = None
    needs_numba: ClassVar[bool] = True
    _cost: ClassVar[int] = 1  # relative work per value, to size thread chunks (K-quants search many scales)
    #: a kernel in ``loops`` that quantizes F16 bits straight, ``(name, extra arguments)``: ``kernel(bits (flat
    #: uint16), out (flat blocks), *extra)`` returns the NaN / ±inf count; `quantize_f16_rows` runs it instead of
    #: the decode and `quantize_rows_into`
    from_f16: ClassVar[tuple[str, tuple[Any, ...]] | None] = None

    def _block_kernel(self) -> Callable[[np.ndarray, np.ndarray], Any]:
        """``_kernel`` as a function (a name is looked up in ``loops``, importing numba)."""
        kernel = type(self)._kernel
        if isinstance(kernel, tuple):  # (name, extra arguments after x and out)
            function, extra = getattr(K, kernel[0]), kernel[1]
            return lambda x, out: function(x, out, *extra)
        return getattr(K, kernel) if isinstance(kernel, str) else kernel

    def _weighted_kernel(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """``_weighted`` as (a function, its extra arguments): a name is looked up in ``loops``."""
        assert self._weighted is not None
        kernel, extra = self._weighted
        return (getattr(K, kernel) if isinstance(kernel, str) else kernel), extra

    @property
    def uses_weights(self) -> bool:
        return self._weighted is not None

    def quantize_rows_weighted(self, x: np.ndarray, imatrix: np.ndarray, threads: int | None = None) -> np.ndarray:
        if self._weighted is None:
            return super().quantize_rows_weighted(x, imatrix, threads)
        kernel, extra = self._weighted_kernel()
        out = np.empty((x.shape[0], self.row_bytes(x.shape[1])), dtype=np.uint8)
        run_chunked(lambda xs, os: kernel(xs, imatrix, os, *extra), np.ascontiguousarray(x, dtype=np.float32), out,
                    threads, elems_per_row=x.shape[1] * max(self._cost, 40))
        return out

    def quantize_rows_into(self, x: np.ndarray, out: np.ndarray, imatrix: np.ndarray | None) -> None:
        if imatrix is not None and self._weighted is not None:
            kernel, extra = self._weighted_kernel()
            kernel(x, imatrix, out, *extra)
            return
        self._block_kernel()(x.reshape(-1, self.block_size), out.reshape(-1, self.type_size))

    def quantize_blocks(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.block_size:
            raise DFlashError(f"{self.name}.quantize_blocks needs float32 [n_blocks, {self.block_size}], "
                              f"got shape {x.shape}")
        out = np.empty((x.shape[0], self.type_size), dtype=np.uint8)
        run_chunked(self._block_kernel(), x, out, threads,
                    elems_per_row=self.block_size * self._cost)
        return out


# ----------------------------------------------------------------------------------------- dequant helpers
def fp16_col(q: np.ndarray, pos: int) -> np.ndarray:
    """The fp16 field at byte ``pos`` of each block as float32 [n_blocks, 1] (exact widening)."""
    return np.ascontiguousarray(q[:, pos:pos + 2]).view(np.float16).astype(np.float32)


_NIBBLE_SHIFT = np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)


def unpack_nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """Per ``group`` bytes: low nibbles give the first ``group`` values, high nibbles the next ``group``."""
    n = qs.shape[0]
    return ((qs.reshape(n, -1, 1, group) >> _NIBBLE_SHIFT) & np.uint8(0x0F)).reshape(n, -1)
