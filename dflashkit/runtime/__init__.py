"""PyTorch runtime for DFlash drafters, reproducing z-lab's reference (``dflash`` on PyPI).

    from dflashkit.runtime import load_drafter, load_target_head
    model = load_drafter("drafter.gguf")                      # or an HF checkpoint directory
    head = load_target_head("target.gguf")                    # embed_tokens + lm_head of the target
    cache = model.new_cache()
    step = model.draft(target_hidden, block_ids, position_ids, cache, head)   # one round
    step.logits, step.tokens, step.hidden

`dflash.py` holds the shared drafter every family builds on (the model and its draft round), `blocks.py` its
building blocks (attention, MLP, norms, RoPE, sampling), `linear.py` the linear layer with its dense, quantized
or packed weights; a family's own block is ``runtime.py`` in its folder (`dflashkit.families`), found through
`zoo.py`. `cache.py` holds the croppable KV cache, `load.py` the loaders, `target.py` the transformers target
runner (tap features).
"""

from .cache import DraftCache
from .dflash import DFlashDraftModel, DraftStep, Linear, TargetHead
from .load import DTYPES, LoadInfo, kernels_available, load_drafter, load_target_head, resolve_device, resolve_dtype
from .target import DEFAULT_PROMPT, GreedyStream, HFTarget, extract_context_feature

__all__ = [
    "DEFAULT_PROMPT",
    "DTYPES",
    "DFlashDraftModel",
    "DraftCache",
    "DraftStep",
    "GreedyStream",
    "HFTarget",
    "Linear",
    "LoadInfo",
    "TargetHead",
    "extract_context_feature",
    "kernels_available",
    "load_drafter",
    "load_target_head",
    "resolve_device",
    "resolve_dtype",
]
