"""The drafter's KV cache: per layer, the keys/values of every position seen so far, croppable.

Same contract as the ``DynamicCache`` z-lab's ``dflash_generate`` uses: a forward call appends the
keys/values of the new context *and* of the noise block, and the caller then crops back to the
context length (``crop(start)``), so the next round only sees context. Keys are stored after
``k_norm`` and RoPE, exactly as they enter attention.
"""

from __future__ import annotations

import torch


class DraftCache:
    """Keys/values per layer, shaped ``[batch, kv_heads, length, head_dim]``."""

    def __init__(self, n_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    def __len__(self) -> int:
        return self.seq_length

    @property
    def seq_length(self) -> int:
        k = self.keys[0]
        return 0 if k is None else int(k.shape[-2])

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's keys/values for ``layer``; returns everything cached for it (old + new)."""
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            keys = torch.cat([old_k, keys], dim=-2)
            values = torch.cat([old_v, values], dim=-2)
        self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (drop the noise block, or roll back rejected context)."""
        if length < 0:
            raise ValueError(f"cannot crop the drafter cache to a negative length ({length})")
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None and v is not None:
                self.keys[i], self.values[i] = k[..., :length, :], v[..., :length, :]

    def reset(self) -> None:
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)
