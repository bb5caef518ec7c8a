"""The GGUF reader's bounds: the limits a file is held to, the value-type tables, and the cursor that reads
each value only after checking that it fits in the bytes left.

Nothing read from the file is trusted. A declared count or length is checked against the bytes actually left
*before* anything is allocated: a string's length against the bytes left, an array's length against the
smallest encoding of one element, the header's tensor and key-value counts against ``MIN_TENSOR_INFO_SIZE`` /
``MIN_KV_SIZE`` each. Arrays of arrays (which llama.cpp never loads) are capped in number and depth; a numeric
array is one read-only numpy copy of its bytes (`NumericArray`), not a list of Python numbers ten times its
size; text must be UTF-8 and a value type must be known. A problem parsing cannot continue past raises
`GGUFFormatError` at once; the others are raised in strict mode and collected otherwise.

``gguf_reader`` parses the header, key-value pairs and tensor infos with `BoundedCursor` and these limits, and
builds the ``GGUFFile``; the checks that need the parsed layout (tensor types, block sizes, data ranges,
overlaps) are there.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from gguf import GGUFValueType

from dflashkit.errors import FormatError

MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses tensors with more dimensions
MAX_NAME_LEN = 63  # GGML_MAX_NAME is 64 including the terminating NUL
HEADER_SIZE = 24  # magic + version + n_tensors + n_kv
# Smallest possible encodings, used to bound the declared counts by the file size up front.
MIN_KV_SIZE = 8 + 4 + 1  # key length, value type, 1-byte value
MIN_TENSOR_INFO_SIZE = 8 + 4 + 4 + 8  # name length, n_dims, ggml type, offset
MAX_INNER_ARRAYS = 65536  # arrays in one array of arrays (llama.cpp loads none): bounded before Python lists
MAX_ARRAY_NESTING = 32  # arrays of arrays: bounded so a crafted file cannot exhaust the stack
INT64_MAX = 2**63 - 1

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Scalar value types: struct format and size. BOOL is an int8 on disk.
_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "B",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_SCALAR_STRUCTS = {t: struct.Struct("<" + f) for t, f in _SCALAR_FORMATS.items()}
_VALUE_TYPES = {int(t): t for t in GGUFValueType}

FIX_REDOWNLOAD = "re-download or re-convert the file"  # what a truncated or corrupt file message ends with


class NumericArray(Sequence):
    """A GGUF numeric array, held as one read-only numpy copy of its bytes.

    As Python ints / floats the same values cost ~10-18x their bytes (a 100 MB array would take
    1-2 GB): this reads like a list of Python numbers (``len``, indexing, iteration, ``==`` with a list,
    ``tolist()``) and converts only what is asked for.
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        array.flags.writeable = False
        self.array = array

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.array[index].tolist()
        return self.array[index].item()

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, len(self), 4096):  # bounded chunks, never the whole list at once
            yield from self.array[start : start + 4096].tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NumericArray):
            return self.array.shape == other.array.shape and bool(np.array_equal(self.array, other.array))
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[Any]:
        return self.array.tolist()

    def __repr__(self) -> str:
        return repr(self.tolist()) if len(self) <= 16 else f"[{len(self)} x {self.array.dtype}]"


class GGUFFormatError(FormatError):
    """A GGUF file is malformed. See `dflashkit.errors.FormatError`."""


class BoundedCursor:
    """Cursor over the mapped file. Every read is checked against the bytes left."""

    def __init__(self, buf: mmap.mmap, path: Path, size: int, strict: bool) -> None:
        self.buf = buf
        self.path = path
        self.size = size
        self.strict = strict
        self.pos = 0
        self.problems: list[GGUFFormatError] = []
        self.max_array_bytes: int | None = None  # a numeric array value larger than this is refused (open_gguf)

    # -- error reporting ------------------------------------------------------------------------
    def fatal(self, check_id: str, message: str, **values: Any) -> NoReturn:
        raise GGUFFormatError(self.path, check_id, message, **values)

    def problem(self, check_id: str, message: str, **values: Any) -> None:
        """A structural problem parsing can continue past: raised when strict, collected otherwise."""
        err = GGUFFormatError(self.path, check_id, message, **values)
        if self.strict:
            raise err
        self.problems.append(err)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            self.fatal(
                "gguf.truncated",
                f"file ends inside {what}: needs {n} bytes at offset {self.pos} but only "
                f"{self.size - self.pos} are left (file is {self.size} bytes) — {FIX_REDOWNLOAD}",
                offset=self.pos, needed=n, left=self.size - self.pos, file_size=self.size,
            )

    # -- primitives -----------------------------------------------------------------------------
    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string_bytes(self, what: str) -> bytes:
        n = self.u64(f"the length of {what}")
        if n > self.size - self.pos:
            self.fatal(
                "gguf.string_length",
                f"{what} claims {n} bytes at offset {self.pos} but only {self.size - self.pos} are left "
                f"(corrupt length or truncated file) — {FIX_REDOWNLOAD}",
                offset=self.pos, length=n, left=self.size - self.pos,
            )
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def decode(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.problem("gguf.utf8", f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})", offset=self.pos)
            return raw.decode("utf-8", errors="replace")

    # -- values ---------------------------------------------------------------------------------
    def value_type(self, what: str) -> GGUFValueType:
        offset = self.pos
        raw = self.u32(f"the value type of {what}")
        vtype = _VALUE_TYPES.get(raw)
        if vtype is None:
            # Without a known type the value's size is unknown: parsing cannot continue.
            self.fatal(
                "gguf.kv_type",
                f"{what} has unknown value type {raw} at offset {offset} (known: 0..{max(_VALUE_TYPES)})",
                offset=offset, value_type=raw,
            )
        return vtype

    def value(self, vtype: GGUFValueType, what: str, depth: int = 0) -> tuple[Any, GGUFValueType | None]:
        if vtype is GGUFValueType.STRING:
            return self.decode(self.string_bytes(f"the string value of {what}"), what), None
        if vtype is GGUFValueType.ARRAY:
            return self.array(what, depth)
        st = _SCALAR_STRUCTS[vtype]
        self.need(st.size, f"the value of {what}")
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return (v != 0 if vtype is GGUFValueType.BOOL else v), None

    def array(self, what: str, depth: int) -> tuple[list[Any], GGUFValueType]:
        sub = self.value_type(f"the array elements of {what}")
        count_offset = self.pos
        n = self.u64(f"the array length of {what}")
        left = self.size - self.pos
        # Smallest encoding of one element bounds the count before anything is allocated.
        min_elem = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}.get(sub) or _SCALAR_STRUCTS[sub].size
        if n > left // min_elem:
            self.fatal(
                "gguf.array_length",
                f"{what} claims {n} {sub.name} elements at offset {count_offset} but the {left} bytes left "
                f"hold at most {left // min_elem} — {FIX_REDOWNLOAD}",
                offset=count_offset, length=n, left=left, element_type=sub.name,
            )
        if sub is GGUFValueType.STRING:
            return self.string_array(n, what), sub
        if sub is GGUFValueType.ARRAY:
            if depth == 0:
                self.problem("gguf.kv_type", f"{what} is an array of arrays, which llama.cpp cannot load")
            if depth >= MAX_ARRAY_NESTING:
                self.fatal("gguf.kv_type", f"{what} nests arrays deeper than {MAX_ARRAY_NESTING} levels")
            if n > MAX_INNER_ARRAYS:  # 12 bytes each: 11M in 132 MB cost 2.5 GB of Python lists
                self.fatal("gguf.array_length", f"{what} holds {n} arrays, over the cap of {MAX_INNER_ARRAYS} (no "
                           "loader reads an array of arrays)", offset=count_offset, length=n)
            return [self.array(what, depth + 1)[0] for _ in range(n)], sub
        # Numeric arrays: one copy of the bytes straight from the map (no reference to it kept), read lazily.
        nbytes = n * _SCALAR_STRUCTS[sub].size
        if self.max_array_bytes is not None and nbytes > self.max_array_bytes:
            self.fatal("gguf.array_length", f"{what} holds {n} {sub.name} values ({nbytes} bytes), over the "
                       f"{self.max_array_bytes}-byte cap of this kind of file", offset=count_offset, length=n)
        view = np.frombuffer(self.buf, dtype=np.uint8 if sub is GGUFValueType.BOOL else "<" + _SCALAR_FORMATS[sub],
                             count=n, offset=self.pos)
        self.pos += nbytes
        if sub is GGUFValueType.BOOL:
            return NumericArray(view != 0), sub  # type: ignore[return-value]
        return NumericArray(view.copy()), sub  # type: ignore[return-value]

    def string_array(self, n: int, what: str) -> list[str]:
        # Hot loop for tokenizer vocabularies and merges (~150k entries): locals only, no method calls.
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        raw: list[bytes] = []
        append = raw.append
        for i in range(n):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"the length of element {i} of {what}")
            (ln,) = unpack(buf, pos)
            pos += 8
            if ln > size - pos:
                self.fatal(
                    "gguf.string_length",
                    f"element {i} of {what} claims {ln} bytes at offset {pos} but only {size - pos} are left "
                    f"(corrupt length or truncated file) — {FIX_REDOWNLOAD}",
                    offset=pos, length=ln, left=size - pos, index=i,
                )
            append(buf[pos : pos + ln])
            pos += ln
        self.pos = pos
        try:
            return [b.decode("utf-8") for b in raw]
        except UnicodeDecodeError:
            bad = next(i for i, b in enumerate(raw) if not _is_utf8(b))
            self.problem("gguf.utf8", f"element {bad} of {what} is not valid UTF-8", index=bad)
            return [b.decode("utf-8", errors="replace") for b in raw]


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
