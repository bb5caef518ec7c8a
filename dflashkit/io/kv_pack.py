"""Fast packing of large GGUF metadata arrays (the tokenizer's tokens, types and merges).

gguf-py's ``GGUFWriter._pack_val`` packs an array element by element through a recursive call and a
``struct.pack`` each: for a 150 k-token vocabulary (tokens + token types + merges) that is about a
second of pure Python per written file — more than copying a 1 GB drafter's tensors. The bytes are
simple (GGUF: ``u32 type, u64 count``, then per string ``u64 length + UTF-8``, numbers packed
little-endian back to back), so :func:`install` swaps in a packer that builds arrays whose element
type is known in one ``join`` / one ``struct.pack`` and hands every other value to gguf-py.
Same bytes as gguf-py (the converter's byte-identity tests against llama.cpp's output cover it).
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGUFEndian

_PACK_LEN = struct.Struct("<Q").pack


def install(writer: GGUFWriter) -> None:
    """Make ``writer`` pack typed little-endian metadata arrays in bulk (other values unchanged)."""
    if writer.endianess != GGUFEndian.LITTLE:
        return
    original: Callable[..., bytes] = writer._pack_val
    simple = writer._simple_value_packing

    def pack_val(val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None) -> bytes:
        if vtype != GGUFValueType.ARRAY or sub_type is None or isinstance(val, (bytes, str)) or len(val) == 0:
            return original(val, vtype, add_vtype, sub_type)
        if sub_type == GGUFValueType.STRING:
            encoded = [v.encode("utf-8") if isinstance(v, str) else v for v in val]
            body = b"".join(_PACK_LEN(len(e)) + e for e in encoded)
        elif sub_type in simple:
            body = struct.pack(f"<{len(val)}{simple[sub_type]}", *val)
        else:
            return original(val, vtype, add_vtype, sub_type)
        head = struct.pack("<I", vtype) if add_vtype else b""
        return head + struct.pack("<IQ", sub_type, len(val)) + body

    writer._pack_val = pack_val  # type: ignore[method-assign]
