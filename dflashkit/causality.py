"""Causality inside the drafted block: which layers attend only backwards, as a reference runs a checkpoint and as
llama.cpp runs its GGUF — and where the two differ, in words.

The references decide it per layer. z-lab's ``dflash`` (``Qwen3DFlashAttention.__init__``), vLLM's
``qwen3_dflash._dflash_layer_causal`` and SGLang's ``models/dflash.py``: the config's ``is_causal`` sets every layer;
without it a ``sliding_attention`` layer is causal and a full one bidirectional. vLLM speculators' DFlash layouts
(``window_from_anchor``): full layers bidirectional, sliding ones causal unless ``sliding_window_non_causal``.

llama.cpp (both pinned builds) reads one key, ``dflash.attention.causal`` (absent: false), and sets one flag for the
whole draft context (``common/speculative.cpp``: ``llama_set_causal_attn(ctx_dft, …)``); the full and the sliding
masks both take it (``src/llama-kv-cache.cpp``). A checkpoint whose layers differ runs in llama.cpp as another
model: `lost_causality` says so, and the GGUF records the reference's rule under `CAUSAL_LAYERS_KEY`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

#: where a GGUF records the per-layer rule its checkpoint's reference runs (dflashkit's own namespace: llama.cpp
#: does not read it)
CAUSAL_LAYERS_KEY = "dflashkit.attention.causal_layers"


def sliding_layers(spec: Any) -> tuple[bool, ...]:
    """Per layer, True for a sliding-window layer (the spec's pattern; none: no sliding layer)."""
    pattern = tuple(bool(x) for x in (spec.sliding_window_pattern or ()))
    return tuple(pattern[i] if i < len(pattern) else False for i in range(spec.n_layers))


def reference_causal_layers(spec: Any, *, window_from_anchor: bool = False,
                            sliding_window_non_causal: bool = False) -> tuple[bool, ...]:
    """Per layer, causal or not, as the checkpoint's reference runs it (module doc)."""
    sliding = sliding_layers(spec)
    if window_from_anchor:
        return tuple(s and not sliding_window_non_causal for s in sliding)
    if spec.causal is not None:
        return (bool(spec.causal),) * spec.n_layers
    return sliding


def window_non_causal(family: Any, config: Mapping[str, Any] | None) -> bool:
    """speculators' ``sliding_window_non_causal`` of an HF config (its family's default where the config is silent)."""
    return bool((config or {}).get("sliding_window_non_causal", family.window_non_causal_default))


def checkpoint_causal_layers(spec: Any, family: Any, config: Mapping[str, Any] | None) -> tuple[bool, ...]:
    """`reference_causal_layers` of an HF checkpoint: its family's window rule, its config's non-causal window."""
    return reference_causal_layers(spec, window_from_anchor=family.window_from_anchor,
                                   sliding_window_non_causal=window_non_causal(family, config))


def llama_cpp_causal_layers(spec: Any) -> tuple[bool, ...]:
    """Per layer, as llama.cpp runs the GGUF: the one flag for every layer (absent: bidirectional)."""
    return (bool(spec.causal),) * spec.n_layers


def runtime_causal_layers(spec: Any) -> tuple[bool, ...]:
    """What dflashkit's runtime runs: llama.cpp's one flag for a GGUF of a dialect that reads it so
    (``llama_cpp_masks``, `dflashkit.runtime.config`), else the reference's rule."""
    if getattr(spec, "llama_cpp_masks", False):
        return llama_cpp_causal_layers(spec)
    return reference_causal_layers(spec, window_from_anchor=bool(getattr(spec, "window_from_anchor", False)),
                                   sliding_window_non_causal=bool(getattr(spec, "sliding_window_non_causal", False)))


def _layers(flags: Sequence[bool], want: bool) -> str:
    ids = [i for i, f in enumerate(flags) if f == want]
    return ", ".join(map(str, ids)) if ids else "none"


def describe(flags: Sequence[bool]) -> str:
    """``layers 0, 1, 2 causal and 3 bidirectional`` / ``every layer causal``."""
    if all(flags):
        return "every layer causal"
    if not any(flags):
        return "every layer bidirectional"
    return f"layers {_layers(flags, True)} causal and {_layers(flags, False)} bidirectional"


def lost_causality(reference: Sequence[bool], flag: bool | None) -> str | None:
    """Where llama.cpp's one flag (``flag``; None: absent) runs other layers than ``reference``: one phrase, else
    None."""
    run = bool(flag)
    if all(r == run for r in reference):
        return None
    shown = "absent, so false" if flag is None else str(bool(flag)).lower()
    return (f"the reference runs {describe(reference)}; llama.cpp reads one flag for every layer "
            f"(dflash.attention.causal: {shown}) and will run {describe([run] * len(reference))}")


def masks_differ_in_llama_cpp(spec: Any) -> bool:
    """True where llama.cpp's masks (one causal flag; a window on the past side only) run ``spec`` otherwise than its
    reference's: a layer's causality differs, or a bidirectional sliding layer's window is shorter than the block
    (the reference then hides block positions ahead of a query too)."""
    reference = reference_causal_layers(spec)
    if reference != llama_cpp_causal_layers(spec):
        return True
    window = spec.sliding_window
    bidirectional_sliding = any(s and not c for s, c in zip(sliding_layers(spec), reference))
    return bool(window) and window < spec.block_size and bidirectional_sliding


def causality_differs(reference: Any, candidate: Any) -> list[str]:
    """What of two drafters' causality (each as the runtime runs it) differs: one phrase, or nothing."""
    a, b = runtime_causal_layers(reference), runtime_causal_layers(candidate)
    if a == b:
        return []
    how = ("as llama.cpp runs the file: one flag for every layer" if getattr(candidate, "llama_cpp_masks", False)
           else "its own rule")
    return [f"per-layer causality — the reference runs {describe(a)}, the candidate ({how}) {describe(b)}"]
