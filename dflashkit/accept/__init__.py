"""`dflash-accept`: what a drafter file is worth in speculative decoding — τ here and in llama.cpp, speed-up and
identical output through llama-server.

- `run` — the measurement (`run_acceptance`): the reference runtime's draft–verify loop, llama.cpp, llama-server;
- `result` — what it measured, the verdicts and the gates (`AcceptMeasurement`, `DrafterRun`);
- `report` — the report built from a result, and the PNG chart;
- `prompts` — the prompts file, the built-in set and the chat-template switches;
- `serving` — τ, speed-up and identical output through llama-server (`measure_serving`).

The names a user imports from ``dflashkit.accept`` are re-exported here.
"""

from ..stats import Comparison, paired_bootstrap_ci, paired_comparison
from .prompts import Prompt, builtin_prompts_path, load_prompts, parse_template_kwargs, reasoning_template_kwargs
from .report import build_report, require_matplotlib, write_png
from .result import (BOOTSTRAP_RESAMPLES, CI_METHOD, CONFIDENCE, EXIT_FAILED, EXIT_OK, SPEED_NOTE, TAU_RANDOM_NOTE,
                     VERDICT_ABOVE, VERDICT_AGREES, VERDICT_BELOW, VERDICT_CRASHED, VERDICT_NONFINITE,
                     VERDICT_REFERENCE, VERDICT_REFUSED, VERDICT_ZERO, WARMUP_TOKENS, AcceptMeasurement, DrafterRun,
                     ci_text)
from .run import AcceptResult, run_acceptance

__all__ = [
    "run_acceptance", "AcceptResult", "AcceptMeasurement", "DrafterRun", "build_report", "require_matplotlib",
    "write_png", "Prompt", "builtin_prompts_path", "load_prompts", "parse_template_kwargs", "reasoning_template_kwargs",
    "Comparison", "paired_bootstrap_ci", "paired_comparison", "BOOTSTRAP_RESAMPLES", "CI_METHOD", "CONFIDENCE",
    "EXIT_FAILED", "EXIT_OK", "SPEED_NOTE", "TAU_RANDOM_NOTE", "VERDICT_ABOVE", "VERDICT_AGREES", "VERDICT_BELOW",
    "VERDICT_CRASHED", "VERDICT_NONFINITE", "VERDICT_REFERENCE", "VERDICT_REFUSED", "VERDICT_ZERO", "WARMUP_TOKENS",
    "ci_text",
]
