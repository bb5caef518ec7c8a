"""llama.cpp's τ against the reference runtime's τ of the same drafter on the same llama.cpp schedule: one verdict
and one ``--max-gap`` rule for both programs — llama-speculative-simple's rows (``--llama-cpp``) and llama-server's
(``--llama-server`` / ``--server-url``), so a gap means the same thing wherever it is measured."""

from __future__ import annotations

import math
from typing import Sequence

from ..stats import CONFIDENCE, Comparison

#: verdicts of llama.cpp's τ against its reference's; stable strings (the JSON report's ``llama_cpp_verdict`` and
#: the serving rows' ``tau_verdict``)
VERDICT_AGREES = "agrees"
VERDICT_ABOVE = "above reference"
VERDICT_BELOW = "below reference"
#: what a gap with no cause found says (per-layer causality, the audit's rows, quantization, tokenization, the draft
#: cache and the target GGUF all checked)
NO_CAUSE = "no cause dflashkit can check"


def ci_text(c: Comparison) -> str:
    if c.ci is None:
        return "no CI (< 2 prompts)"
    return f"{CONFIDENCE:.0%} CI [{c.ci[0]:+.2f}, {c.ci[1]:+.2f}]"


def gap_verdict(c: Comparison) -> str:
    """Above / below when the paired CI excludes 0 (one prompt: no CI, its own difference), else agrees."""
    if c.significant or (c.ci is None and c.n_prompts == 1 and c.delta != 0):
        return VERDICT_BELOW if c.delta < 0 else VERDICT_ABOVE
    return VERDICT_AGREES


def gap_side(c: Comparison, reference_tau: float, max_gap: float) -> str | None:
    """"below" / "above" when llama.cpp's τ is significantly more than ``max_gap`` (a fraction of the reference's τ)
    off the reference's — the whole CI past the bound (one prompt: its difference) — else None."""
    if not (math.isfinite(reference_tau) and reference_tau > 0 and c.n_prompts):
        return None
    low, high = c.ci if c.ci is not None else (c.delta, c.delta)
    return "below" if -high / reference_tau > max_gap else "above" if low / reference_tau > max_gap else None


def gap_message(name: str, program: str, tau: float, reference_tau: float, c: Comparison, max_gap: float,
                causes: Sequence[str], schedule: str | None) -> list[str]:
    """The ``--max-gap`` failure of one row (empty when it holds), naming the likely causes found."""
    side = gap_side(c, reference_tau, max_gap)
    if side is None:
        return []
    why = ("; likely cause: " + "; ".join(causes) if causes else
           f"; {NO_CAUSE}")
    where = f" on {schedule}'s schedule" if schedule else ""
    return [f"{name}: {program} τ {tau:.2f} is significantly more than {max_gap:.1%} {side} the reference "
            f"runtime's {reference_tau:.2f}{where} (--max-gap; {ci_text(c)}){why}"]
