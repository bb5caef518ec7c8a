"""Files whose meaning depends on the llama.cpp build that runs them (the builds dflashkit checks:
docs/llama-cpp.md).

- ``drafter.tied_head``: a drafter GGUF with ``token_embd.weight`` and no ``output.weight``. llama.cpp 0.3.36's
  loader tied the drafter's head to its own ``token_embd``; mainline (b11549, ``src/models/dflash.cpp``) no longer
  does, and such a file runs there with the *target's* head, silently.
- ``target.gemma_embedding_scale`` (with ``--target``): a drafter of a family llama.cpp converts as its
  ``DFlashModel``, whose file has no ``embedding_scale`` key, for a Gemma target. Mainline's converter writes
  √hidden_size there (`target_rules.GEMMA_SCALE_RULE`); 0.3.36 and z-lab's PyTorch reference use 1.0.
"""

from __future__ import annotations

from collections.abc import Iterator

from dflashkit.errors import DFlashError
from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.drafter import drafter_of
from dflashkit.inspect.findings import Finding, warning
from dflashkit.inspect.target_fit import cached_target
from dflashkit.target_rules import GEMMA_SCALE_RULE, gemma_embedding_scale


@register_check("llama_cpp.builds", order=450)
def check_build_dependent(ctx: InspectContext) -> Iterator[Finding]:
    drafter = drafter_of(ctx)
    if drafter is None or drafter.spec is None:
        return
    if ctx.gguf is not None and "token_embd.weight" in ctx.gguf.tensors and "output.weight" not in ctx.gguf.tensors:
        yield warning(
            "drafter.tied_head",
            f"{ctx.path}: token_embd.weight but no output.weight — llama.cpp 0.3.36 ties the drafter's head to its "
            "own token_embd, mainline llama.cpp (b11549) no longer does and runs this file with the target's head; "
            "add output.weight (a copy of token_embd.weight) by converting a checkpoint with lm_head.weight")
    family, spec = drafter.family, drafter.spec
    if ctx.target is None or family is None or not family.gemma_target_embedding_scale \
            or spec.embedding_scale is not None:
        return
    target = cached_target(ctx)
    if isinstance(target, DFlashError):
        return  # target.fit reports it
    scale = gemma_embedding_scale(target.architecture, target.hidden_size)
    if scale is not None:
        yield warning(
            "target.gemma_embedding_scale",
            f"{ctx.path}: no embedding_scale for the Gemma target {target.architecture} — {GEMMA_SCALE_RULE}; "
            f"mainline llama.cpp runs this file unscaled where its own conversion would scale by {scale:g}: "
            "re-convert with dflash-convert (it writes √hidden_size and says so) or pass --embedding-scale 1 to keep "
            "unscaled embeddings on purpose", expected=scale)
