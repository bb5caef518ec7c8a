"""Audit rows of the heads area (docs/causality.md): see `dflashkit.divergences`.

llama.cpp (``src/models/dflash.cpp``) applies ``dflash.logit_scale`` and the final softcap only for DFlash 2 (a
candidate selector); DFlash 1 logits and a Markov-head drafter's stay raw, and its Markov bias is added to them.
Its DFlash path (no ``markov_w1.weight``) reads draft slots 1.. whatever ``dflash.sample_from_anchor`` says
(``common/speculative.cpp``). `llama_cpp_transforms_logits` and `llama_cpp_reads_anchor_slot` are those two rules,
read by the runtime for a llama.cpp GGUF.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import Rule


def has_markov_head(spec: Any) -> bool:
    """llama.cpp's test: a Markov head (``markov_w1.weight``) chooses its anchor-sampling draft type."""
    return bool(getattr(spec, "markov_rank", None))


def llama_cpp_transforms_logits(spec: Any) -> bool:
    """Whether llama.cpp scales / softcaps this drafter's logits: only DFlash 2 (a candidate selector)."""
    return bool(getattr(spec, "selector_top_k", None) or getattr(spec, "selector_rank", None))


def llama_cpp_reads_anchor_slot(spec: Any) -> bool:
    """Whether llama.cpp drafts from block slot 0: only a Markov-head drafter with ``sample_from_anchor``."""
    return has_markov_head(spec) and bool(getattr(spec, "sample_from_anchor", False))


def _scale(spec: Any) -> float | None:
    """The logit scale the reference applies (None: none, or 1)."""
    s = getattr(spec, "logit_scale", None)
    return None if s is None or float(s) == 1.0 else float(s)


def _softcap(spec: Any) -> float | None:
    c = getattr(spec, "final_logit_softcapping", None)
    return float(c) if c is not None and float(c) > 0 else None


def _dflash1(spec: Any) -> bool:
    return not has_markov_head(spec) and not llama_cpp_transforms_logits(spec)


_PROBS = "probabilities and --spec-draft-p-min thresholds change"


def _softcap_dflash1(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    cap = _softcap(spec)
    if cap is None or not _dflash1(spec):
        return None
    return (f"the reference caps the logits with tanh at {cap:g}; llama.cpp applies the softcap only for DFlash 2 and "
            "runs this DFlash 1 drafter's logits uncapped — greedy argmax is unchanged (tanh is monotonic), "
            f"{_PROBS}")


def _scale_dflash1(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    scale = _scale(spec)
    if scale is None or not _dflash1(spec):
        return None
    argmax = ("greedy argmax is unchanged (a positive scale)" if scale > 0
              else "greedy argmax changes too (a scale that is not positive)")
    return (f"the reference scales the logits by {scale:g}; llama.cpp applies dflash.logit_scale only for DFlash 2 and "
            f"runs this DFlash 1 drafter's logits unscaled — {argmax}, {_PROBS}")


def _sample_from_anchor(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    if has_markov_head(spec) or not getattr(spec, "sample_from_anchor", False):
        return None
    return ("the reference predicts the first draft token at block slot 0 (sample_from_anchor: true); llama.cpp's "
            "DFlash path (no markov_w1.weight) ignores the key and reads slots 1.. — every draft token shifts by one "
            "position and the block drafts one token fewer")


def _markov_bias_on_raw_logits(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    scale, cap = _scale(spec), _softcap(spec)
    if not has_markov_head(spec) or (scale is None and cap is None):
        return None
    done = " and ".join(x for x in (f"scales the logits by {scale:g}" if scale is not None else "",
                                    f"caps them with tanh at {cap:g}" if cap is not None else "") if x)
    return (f"the reference (as dflashkit runs the checkpoint) {done} before adding the Markov bias; llama.cpp applies "
            "neither for a Markov-head drafter and adds the bias to the raw logits — the Markov chain's argmax, so the drafts, can "
            "differ")


RULES: list[Rule] = [
    Rule("heads.softcap-dflash1", "final_logit_softcapping", _softcap_dflash1),
    Rule("heads.logit-scale-dflash1", "output_multiplier", _scale_dflash1),
    Rule("heads.sample-from-anchor-dflash", "sample_from_anchor", _sample_from_anchor),
    Rule("heads.markov-bias-raw-logits", "output_multiplier / final_logit_softcapping", _markov_bias_on_raw_logits),
]
