"""llama.cpp as a second runtime: its programs run as a user runs them, their numbers read back exactly.

- `process`: one way to start a llama.cpp program (extra arguments checked, crashes named, never left behind);
- `speculative_simple`: τ through ``llama-speculative-simple`` (counts read from its log);
- `server`: ``llama-server`` started, asked and stopped (counts and timings read from its JSON, which cannot lose
  lines);
- `target`: the target as a GGUF (given, or made by llama.cpp's own converter).
"""

from .process import NO_REPACK_NOTE, LlamaCppCrashed, check_extra_args, crash_message, signal_name
from .speculative_simple import (
    MAX_PROMPT_BYTES,
    RETRIES,
    SPECULATIVE_BINARY,
    LlamaCppDrafterRun,
    LlamaCppLogLost,
    LlamaCppPromptRun,
    LlamaCppRefused,
    PerPromptTau,
    check_counts,
    check_prompt_text,
    find_binary,
    mean_tau,
    parse_counts,
    refusal_message,
    run_drafter,
    run_prompt,
)
from .target import CONVERTER_RUNNER, SRC_ENV, llama_cpp_src, target_gguf_from_hf, temp_dir

__all__ = [
    "NO_REPACK_NOTE",
    "CONVERTER_RUNNER", "MAX_PROMPT_BYTES", "RETRIES", "SPECULATIVE_BINARY", "SRC_ENV", "LlamaCppCrashed",
    "LlamaCppDrafterRun", "LlamaCppLogLost", "LlamaCppPromptRun", "LlamaCppRefused", "PerPromptTau", "check_counts",
    "check_extra_args", "check_prompt_text", "crash_message", "find_binary", "llama_cpp_src", "mean_tau",
    "parse_counts", "refusal_message", "run_drafter", "run_prompt", "signal_name", "target_gguf_from_hf", "temp_dir",
]
