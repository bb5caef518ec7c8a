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
    """Above / below when the paired CI excludes 0 (one prompt: no CI, its own difference), else agrees. Where at
    least half the prompts are exactly equal the two runtimes compute the same drafter and the rest are float ties,
    discrete events: then the prompts that differ must also lean one way beyond chance (the sign test,
    `Comparison.sign_test_p`) — the interval of a mean is too narrow when four prompts of 48 fall the same way."""
    signs = c.sign_test_p
    ties = c.n_higher is not None and c.n_lower is not None and 2 * (c.n_higher + c.n_lower) <= c.n_prompts
    if (c.significant and not (ties and signs is not None and signs >= 1 - CONFIDENCE)) or (
            c.ci is None and c.n_prompts == 1 and c.delta != 0):
        return VERDICT_BELOW if c.delta < 0 else VERDICT_ABOVE
    return VERDICT_AGREES


def gap_side(c: Comparison, reference_tau: float, max_gap: float) -> str | None:
    """"below" / "above" when llama.cpp's τ is significantly off the reference's (the paired CI excludes 0; one
    prompt: a non-zero difference) and its mean difference is more than ``max_gap`` (a fraction of the reference's
    τ) — the rule ``--max-drop`` applies to a drafter's τ, made two-sided and asked for significance — else None."""
    if not (math.isfinite(reference_tau) and reference_tau > 0 and c.n_prompts):
        return None
    verdict = gap_verdict(c)
    if verdict == VERDICT_AGREES or abs(c.delta) / reference_tau <= max_gap:
        return None
    return "below" if verdict == VERDICT_BELOW else "above"


def gap_message(name: str, program: str, tau: float, reference_tau: float, c: Comparison, max_gap: float,
                causes: Sequence[str], schedule: str | None) -> list[str]:
    """The ``--max-gap`` failure of one row (empty when it holds), naming the likely causes found."""
    side = gap_side(c, reference_tau, max_gap)
    if side is None:
        return []
    why = ("; likely cause: " + "; ".join(causes) if causes else
           f"; {NO_CAUSE}")
    where = f" on {schedule}'s schedule" if schedule else ""
    gap = abs(c.delta) / reference_tau
    shown = f"{gap:.1%}" if f"{gap:.1%}" != f"{max_gap:.1%}" else f"{gap:.2%}"  # never "5.0% … > 5.0%"
    return [f"{name}: {program} τ {tau:.2f} is {shown} {side} the reference runtime's "
            f"{reference_tau:.2f}{where} (> --max-gap {max_gap:.1%}, and significant: {ci_text(c)}){why}"]
