"""Audit rows of the rope area (docs/causality.md): see `dflashkit.divergences`.

llama.cpp (``src/models/dflash.cpp``, both pinned builds) ropes ``n_rot`` = ``dflash.rope.dimension_count`` dims of
the head NeoX-style and passes the rest through; it reads no ``rope.scaling.yarn_*`` key for dflash (only grok and
mistral3 do), so YaRN runs with its defaults (``yarn_llama_cpp``); and it multiplies each layer's attention output
(after ``attn_output``) by ``dflash.attention.value_scale`` when that is not 0. The runtime runs a llama.cpp GGUF so
(``RuntimeConfig.llama_cpp_rules``: `dflashkit.runtime.blocks`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from . import Rule

#: llama.cpp's YaRN defaults for a dflash model (``llama-hparams.h``: yarn_beta_fast / yarn_beta_slow)
LLAMA_CPP_BETA_FAST, LLAMA_CPP_BETA_SLOW = 32.0, 1.0


def yarn_mscale(factor: float) -> float:
    """``get_mscale(factor)`` (transformers / ``llama-context.cpp``): the YaRN magnitude factor."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def yarn_llama_cpp(factor: float) -> dict[str, float]:
    """The YaRN values llama.cpp rotates a dflash GGUF with, whatever the file says: ext_factor 1 (yarn type), betas
    32 / 1, and cos/sin multiplied by ``attn_factor · (1 + 0.1 ln factor)`` = mscale(factor) (``llama-context.cpp``
    divides that second factor out of attn_factor, ggml's ``rope_yarn`` multiplies it back)."""
    return {"beta_fast": LLAMA_CPP_BETA_FAST, "beta_slow": LLAMA_CPP_BETA_SLOW, "attention_factor": yarn_mscale(factor)}


def partial_rotary_dims(spec: Any) -> int | None:
    """``n_rot`` when it is narrower than the head (a ``partial_rotary_factor`` < 1), else None."""
    n = getattr(spec, "rope_dimension_count", None)
    return int(n) if n is not None and 0 < int(n) < int(spec.head_dim) else None


def attention_value_scale(spec: Any) -> float | None:
    """The scale llama.cpp multiplies each attention output by (None: 0 or absent, which it skips, or 1)."""
    s = getattr(spec, "attention_value_scale", None)
    return None if s is None or float(s) in (0.0, 1.0) else float(s)


def _partial_rotary(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    n = partial_rotary_dims(spec)
    if n is None:
        return None
    d = spec.head_dim
    return (f"the reference (z-lab's Qwen3 attention) rotates all {d} dimensions of the head — its Qwen3 rotary "
            f"embedding ignores the factor, and dflashkit's runtime runs the checkpoint so; llama.cpp rotates only the "
            f"first {n} of the {d} (rope.dimension_count, NeoX pairs within them) and passes the other {d - n} through")


def _yarn_extras(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    scaling = dict(spec.rope_scaling or ())
    if scaling.get("type") != "yarn" or scaling.get("factor") is None:
        return None
    ours = yarn_llama_cpp(float(scaling["factor"]))
    theirs = {"beta_fast": scaling.get("beta_fast"), "beta_slow": scaling.get("beta_slow"),
              "attention_factor": scaling.get("attn_factor")}
    differ = [(k, float(v)) for k, v in theirs.items() if v is not None and not math.isclose(float(v), ours[k],
                                                                                             rel_tol=1e-6)]
    if not differ:
        return None
    said = ", ".join(f"{k} {v:g}" for k, v in differ)
    used = ", ".join(f"{k} {ours[k]:.6g}" for k, _ in differ)
    return (f"the reference (transformers' YaRN) rotates with {said}; llama.cpp reads no rope.scaling.yarn_* key for "
            f"dflash and rotates with its defaults, {used}")


def _value_scale(spec: Any, config: Mapping[str, Any] | None) -> str | None:
    s = attention_value_scale(spec)
    if s is None:
        return None
    return (f"the reference (z-lab) does not read it — the attention output is not scaled; llama.cpp multiplies "
            f"each layer's attention output (after o_proj) by {s:g}")


RULES: list[Rule] = [
    Rule("partial-rotary", "partial_rotary_factor", _partial_rotary),
    Rule("yarn-extras", "rope_scaling (yarn)", _yarn_extras),
    Rule("attention-value-scale", "attention_value_scale", _value_scale),
]
