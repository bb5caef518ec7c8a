"""Audit rows of sliding windows (docs/causality.md): where the window a checkpoint's reference runs and the one
llama.cpp runs from dflashkit's GGUF differ, and where dflashkit's window keys differ from llama.cpp's converter's.

llama.cpp masks a sliding layer per query on the past side only (``is_masked_swa``: a key is hidden iff
``p_query − p_key ≥ n_swa``; both pinned builds, ``src/llama-hparams.h``), for every layer the pattern names.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..causality import reference_causal_layers, sliding_layers
from . import Rule


def _sliding_ids(spec: Any) -> str:
    return ", ".join(str(i) for i, s in enumerate(sliding_layers(spec)) if s)


def _window_keys_from_layer_types(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    """dflashkit writes the window of ``layer_types``; llama.cpp's converter only under ``use_sliding_window`` /
    ``dflash_config.use_swa`` (``conversion/qwen.py``), and transformers' Qwen3Config drops the window at load
    without ``use_sliding_window``."""
    if config is None or not spec.sliding_window or not any(sliding_layers(spec)):
        return None
    nested = config.get("dflash_config") if isinstance(config.get("dflash_config"), Mapping) else {}
    if config.get("use_sliding_window") or nested.get("use_swa") or config.get("use_swa"):
        return None
    return (f"written from layer_types (window {spec.sliding_window} on layers {_sliding_ids(spec)}) though "
            "use_sliding_window is false — llama.cpp's own converter writes no window keys for this config (its file "
            "runs every layer unwindowed) and transformers' Qwen3Config drops the window at load; dflashkit keeps "
            "the window the layer types name, and llama.cpp runs it")


def _window_from_anchor(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    """A family whose reference counts a sliding layer's window back from the block's anchor (``window_from_anchor``:
    vLLM's layout), llama.cpp per query."""
    if not getattr(spec, "window_from_anchor", False):  # the family's rule (`divergences`: a family lifts it)
        return None
    if not spec.sliding_window or not any(sliding_layers(spec)):
        return None
    w = spec.sliding_window
    return (f"the reference shows a sliding layer the {w} context positions before the block's anchor, "
            f"the same for every slot; llama.cpp counts the window per query, so draft slot i sees {w} − 1 − i of them "
            "(the drafts differ once the context passes the window)")


def _window_shorter_than_block(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    """A bidirectional sliding layer whose window is shorter than the block: the reference hides block positions
    more than W − 1 ahead of a query too (z-lab's symmetric window), llama.cpp only the past side."""
    w = spec.sliding_window
    if not w or w >= spec.block_size or getattr(spec, "window_from_anchor", False):  # its block is never windowed
        return None
    bidirectional = [i for i, (s, c) in enumerate(zip(sliding_layers(spec), reference_causal_layers(spec))) if s and not c]
    if not bidirectional:
        return None
    return (f"window {w} is shorter than the block ({spec.block_size}) on bidirectional sliding layers "
            f"{', '.join(map(str, bidirectional))}: the reference hides block positions {w} or more ahead of a query "
            "too; llama.cpp masks only the past side, so those layers see the whole block ahead")


RULES: list[Rule] = [
    Rule("window-keys", "sliding_window", _window_keys_from_layer_types, converter_only=True),
    Rule("window-from-anchor", "sliding_window (from the anchor)", _window_from_anchor),
    Rule("window-future-side", "sliding_window", _window_shorter_than_block),
]
