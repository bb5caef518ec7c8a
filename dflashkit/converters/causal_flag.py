"""What llama.cpp's one causal flag says in a converted file, and what it cannot say (`dflashkit.causality`).

A checkpoint whose reference runs some layers of the block causal and others not (sliding layers without
``is_causal``: z-lab, vLLM, SGLang) cannot be written for a consumer that reads one flag for every layer
(llama.cpp's ``dflash.attention.causal``). The converter then writes what llama.cpp's own converter writes — no flag
(false) — or what the publisher chooses (``--llama-cpp-causal true|false``), says in one warning which layers will run
otherwise, and records the reference's rule under `CAUSAL_LAYERS_KEY` so that inspect, parity and accept name it;
``--strict`` refuses the file.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..causality import CAUSAL_LAYERS_KEY, checkpoint_causal_layers, lost_causality
from ..divergences import divergences
from ..errors import DFlashError, UsageError
from ..spec import DrafterSpec

FIX = "choose llama.cpp's flag with --llama-cpp-causal true|false (docs/causality.md)"


def decide_causal_flag(spec: DrafterSpec, family: Any, config: Mapping[str, Any] | None, *, one_causal_flag: bool,
                       choice: bool | None, strict: bool, source: str) -> tuple[DrafterSpec, str | None]:
    """The spec to write (its ``causal`` as chosen, the reference's rule recorded where one flag cannot say it — in
    every dialect, so that a translation keeps it) and the warning (``one_causal_flag``: the dialect's consumer reads
    one flag)."""
    if choice is not None and not one_causal_flag:
        raise UsageError("--llama-cpp-causal sets llama.cpp's dflash.attention.causal: give it with --dialect "
                         "llama.cpp")
    reference = checkpoint_causal_layers(spec, family, config)
    flag = spec.causal if choice is None else choice
    lost = lost_causality(reference, flag)
    written = replace(spec, causal=flag)
    if lost is None:
        return written, None
    if not one_causal_flag:
        return replace(written, reference_causal_layers=reference), None
    if strict:
        raise DFlashError(f"{source}: per-layer causality would be lost: {lost} — refusing under --strict; {FIX}")
    return replace(written, reference_causal_layers=reference), (
        f"{source}: per-layer causality is lost: {lost} — the reference's rule is recorded in {CAUSAL_LAYERS_KEY}; "
        f"{FIX}")


def divergence_warnings(spec: DrafterSpec, config: Mapping[str, Any] | None, *, one_causal_flag: bool, strict: bool,
                        source: str, family: Any = None) -> list[str]:
    """One warning per audit row (`dflashkit.divergences`) where llama.cpp will run the file otherwise than the
    checkpoint's reference runs it (only for the dialect llama.cpp reads: ``one_causal_flag``); ``--strict`` refuses
    at the first."""
    if not one_causal_flag:
        return []
    found = divergences(spec, config, family)
    lost = [d for d in found if not d.rule.converter_only]  # a meaning llama.cpp will not run: --strict refuses it
    if lost and strict:
        raise DFlashError(f"{source}: {lost[0].line()} — refusing under --strict (docs/causality.md)")
    return [f"{source}: {d.line()} (docs/causality.md)" for d in found]
