"""``drafter.causality``: a file whose layers llama.cpp runs otherwise than its checkpoint's reference does
(`dflashkit.causality`).

A GGUF for a consumer that reads one causal flag (llama.cpp) is flagged where the reference's per-layer rule — as
dflash-convert records it (``dflashkit.attention.causal_layers``), or, in a file without that record and without
``dflash.attention.causal`` (llama.cpp's converter writes a false ``is_causal`` as the key, so its absence means the
checkpoint had none), the rule z-lab, vLLM and SGLang apply to sliding layers — is not what the one flag runs. An
HF checkpoint gets an info line: converted for llama.cpp, it would lose that.
"""

from __future__ import annotations

from collections.abc import Iterator

from dflashkit.causality import (CAUSAL_LAYERS_KEY, checkpoint_causal_layers, lost_causality, reference_causal_layers,
                                 sliding_layers)
from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.drafter import drafter_of
from dflashkit.inspect.findings import Finding, info, warning

FIX = "choose llama.cpp's flag when converting: dflash-convert --llama-cpp-causal true|false (docs/causality.md)"


@register_check("drafter.causality", order=455)
def check_causality(ctx: InspectContext) -> Iterator[Finding]:
    drafter = drafter_of(ctx)
    if drafter is None or drafter.spec is None:
        return
    spec = drafter.spec
    if drafter.kind == "gguf":
        if drafter.dialect is None or not drafter.dialect.one_causal_flag:
            return
        if spec.reference_causal_layers is not None:
            reference, whose = tuple(spec.reference_causal_layers), f"as recorded in {CAUSAL_LAYERS_KEY}"
        elif spec.causal is None and any(sliding_layers(spec)):
            reference = reference_causal_layers(spec)
            whose = "as z-lab, vLLM and SGLang run a checkpoint without is_causal (the file has no causal key)"
        else:
            return
        lost = lost_causality(reference, spec.causal)
        if lost is not None:
            yield warning("drafter.causality", f"{ctx.path}: per-layer causality is lost: {lost}; the reference's rule "
                          f"is {whose} — llama.cpp runs this file as another model than its checkpoint; {FIX}",
                          reference=list(reference), flag=spec.causal)
        return
    family = drafter.family
    if family is None:
        return
    reference = checkpoint_causal_layers(spec, family, drafter.metadata if isinstance(drafter.metadata, dict) else None)
    lost = lost_causality(reference, spec.causal)
    if lost is not None:
        yield info("drafter.causality", f"{ctx.path}: converted for llama.cpp, per-layer causality would be lost: "
                   f"{lost}; {FIX}", reference=list(reference), flag=spec.causal)
