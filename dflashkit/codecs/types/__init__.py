"""One module per quant type: its block layout, which quantizer loops it runs (plain, from F16 bits, with importance
weights), its numpy and torch dequantizers, its llama.cpp file types, its fallback and its place in the lists.

The registry fills itself: every module here is imported and its `QuantType` subclass registers itself by
``ggml_type`` (`codecs.base.QUANT_TYPES`); `dflashkit.filetypes`, the quantize policy, the ``--tensor-type`` list,
the values scan and the runtime's torch dequantizers are all read from it. Adding a type: one module here, a test,
one docs row (docs/adding-a-quant-type.md). Loops several types share (one 32-value loop picks its branch by
``kind``; Q4_K / Q5_K share a lane loop) stay in ``codecs/loops``; a type of its own may bring its loops in its module.
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
