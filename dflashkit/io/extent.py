"""`TensorExtent`: where a stored tensor's bytes lie in its file, shared by the GGUF and the safetensors readers'
tensor records (both dataclasses with an absolute ``offset`` and ``nbytes``)."""

from __future__ import annotations


class TensorExtent:
    """Mixed into a dataclass with ``offset`` (absolute file offset of the data) and ``nbytes`` fields."""

    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        """The file offset just past the tensor's bytes."""
        return self.offset + self.nbytes
