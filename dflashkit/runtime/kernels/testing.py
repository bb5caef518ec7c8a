"""Random raw ggml blocks for tests and benchmarks: every bit pattern, but finite fp16 scale fields."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .reference import get_dequant


def random_blocks(ggml_type: GGMLQuantizationType | int | str, rows: int, cols: int, rng: np.random.Generator,
                  scale_range: tuple[float, float] | None = None) -> np.ndarray:
    """uint8 ``[rows, row_bytes]`` of uniformly random bytes whose fp16 fields (d, dmin, m) are finite.

    ``scale_range=None``: the fp16 fields are any finite bit pattern (subnormals and 65504 included), for
    bit-exactness checks. ``(lo, hi)``: log-uniform magnitudes in [lo, hi) with random signs, for matmul checks
    where a huge scale would only test fp32 overflow.
    """
    dq = get_dequant(ggml_type)
    q = rng.integers(0, 256, size=(rows * (cols // dq.block_size), dq.type_size), dtype=np.uint8)
    q = q.reshape(rows * dq.row_bytes(cols) // dq.type_size, dq.type_size)
    for pos in dq.fp16_fields:
        n = q.shape[0]
        if scale_range is None:
            bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
            bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # exponent 31 (inf / nan) -> exponent 15
            vals = bits.view(np.float16)
        else:
            lo, hi = np.log(scale_range[0]), np.log(scale_range[1])
            mag = np.exp(rng.uniform(lo, hi, size=n))
            vals = (mag * rng.choice([-1.0, 1.0], size=n)).astype(np.float16)
        q[:, pos:pos + 2] = vals.view(np.uint8).reshape(n, 2)
    return q.reshape(rows, -1)
