"""Fast packing of large GGUF metadata arrays (the tokenizer's tokens, types and merges).

gguf-py's ``GGUFWriter._pack_val`` packs an array element by element through a recursive call and a
``struct.pack`` each: for a 150 k-token vocabulary (tokens + token types + merges) that is about a
second of pure Python per written file — more than copying a 1 GB drafter's tensors. The bytes are
simple (GGUF: ``u32 type, u64 count``, then per string ``u64 length + UTF-8``, numbers packed
little-endian back to back), so :func:`pack_typed_array` builds arrays whose element type is known in
one ``join`` / one ``struct.pack``; ``gguf_writer._Writer`` hands every other value to gguf-py.
Same bytes as gguf-py (the converter's byte-identity tests against llama.cpp's output cover it).
"""

from __future__ import annotations

import struct
from typing import Any

from gguf import GGUFValueType, GGUFWriter

_PACK_LEN = struct.Struct("<Q").pack
_SIMPLE = GGUFWriter._simple_value_packing  # value type -> struct format letter (gguf-py's own table)


def pack_typed_array(val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None) -> bytes | None:
    """GGUF bytes of a little-endian array of strings or simple numbers, built in bulk; None for every other
    value (the caller hands it to gguf-py)."""
    if vtype != GGUFValueType.ARRAY or sub_type is None or isinstance(val, (bytes, str)) or len(val) == 0:
        return None
    if sub_type == GGUFValueType.STRING:
        encoded = [v.encode("utf-8") if isinstance(v, str) else v for v in val]
        body = b"".join(_PACK_LEN(len(e)) + e for e in encoded)
    elif sub_type in _SIMPLE:
        body = struct.pack(f"<{len(val)}{_SIMPLE[sub_type]}", *val)
    else:
        return None
    head = struct.pack("<I", vtype) if add_vtype else b""
    return head + struct.pack("<IQ", sub_type, len(val)) + body
