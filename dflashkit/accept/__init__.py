"""`dflash-accept`: what a drafter file is worth in speculative decoding — τ here and in llama.cpp, speed-up and
identical output through llama-server.

- `run` — the measurement (`run_acceptance`): the reference runtime's draft–verify loop, llama.cpp, llama-server;
- `result` — what it measured, the verdicts and the gates (`AcceptMeasurement`, `DrafterRun`);
- `report` — the report built from a result, and the PNG chart;
- `prompts` — the prompts file, the built-in set and the chat-template switches;
- `serving_plan` — every llama-server option checked once (`plan_serving` → `ServingPlan`);
- `serving_measure` — τ, speed-up and identical output through llama-server (`measure_serving`, on a plan);
  `serving_only` — that alone on finished files (the release's serving step), on prompts prepared once.

The names a user imports from ``dflashkit.accept`` are re-exported here, each imported on first use.
"""

import importlib
from typing import Any

#: name a user imports from ``dflashkit.accept`` → the module that defines it. Imported on first use, so that
#: ``dflashkit.accept.serving_measure`` (what ``dflash-release`` and ``--check`` need) does not load the runtime and torch.
_EXPORTS = {
    **dict.fromkeys(("Comparison", "paired_bootstrap_ci", "paired_comparison"), "..stats"),
    **dict.fromkeys(("Prompt", "builtin_prompts_path", "load_prompts", "parse_template_kwargs",
                     "reasoning_template_kwargs"), ".prompts"),
    **dict.fromkeys(("build_report", "require_matplotlib", "write_png"), ".report"),
    **dict.fromkeys(("BOOTSTRAP_RESAMPLES", "CI_METHOD", "CONFIDENCE", "EXIT_FAILED", "EXIT_OK", "SPEED_NOTE",
                     "TAU_RANDOM_NOTE", "VERDICT_ABOVE", "VERDICT_AGREES", "VERDICT_BELOW", "VERDICT_CRASHED",
                     "VERDICT_NONFINITE", "VERDICT_REFERENCE", "VERDICT_REFUSED", "VERDICT_ZERO", "WARMUP_TOKENS",
                     "AcceptMeasurement", "DrafterRun", "ci_text"), ".result"),
    **dict.fromkeys(("AcceptResult", "run_acceptance"), ".run"),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "run_acceptance", "AcceptResult", "AcceptMeasurement", "DrafterRun", "build_report", "require_matplotlib",
    "write_png", "Prompt", "builtin_prompts_path", "load_prompts", "parse_template_kwargs", "reasoning_template_kwargs",
    "Comparison", "paired_bootstrap_ci", "paired_comparison", "BOOTSTRAP_RESAMPLES", "CI_METHOD", "CONFIDENCE",
    "EXIT_FAILED", "EXIT_OK", "SPEED_NOTE", "TAU_RANDOM_NOTE", "VERDICT_ABOVE", "VERDICT_AGREES", "VERDICT_BELOW",
    "VERDICT_CRASHED", "VERDICT_NONFINITE", "VERDICT_REFERENCE", "VERDICT_REFUSED", "VERDICT_ZERO", "WARMUP_TOKENS",
    "ci_text",
]
