"""EAGLE-3 checks on a drafter GGUF, as llama.cpp reads it (``src/models/eagle3.cpp``, ``common/speculative.cpp``'s
``draft-eagle3``; identical in both pinned builds).

- what the file is and how llama.cpp runs it: taps, target hidden size, draft vocabulary, the norm flags, and that
  llama.cpp needs ``--spec-type draft-eagle3`` (it does not infer the type from an ``eagle3`` file);
- exactly 3 target layers (``draft-eagle3`` refuses the drafter: "expected 3 extract layers, got N");
- ``fc.weight`` reads 3 × ``target_hidden_size`` features, and ``enc.output_norm.weight`` is there iff
  ``norm_before_fc`` says so (the graph applies the norm only with the flag, and the loader needs the tensor then).

The ``d2t`` map is checked by the DSpark checks (I64, as long as ``output.weight``, in range, unique): one map, one
rule. Shapes are given ne0-first (GGUF order), as llama.cpp logs them.
"""

from __future__ import annotations

from collections.abc import Iterator

from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.drafter import drafter_of
from dflashkit.inspect.findings import Finding, error, info

from . import FAMILY, FC, INPUT_NORM, N_TAPS


@register_check("drafter.eagle3", kinds=("gguf",), order=205)
def check_eagle3(ctx: InspectContext) -> Iterator[Finding]:
    d = drafter_of(ctx)
    if d is None or d.spec is None or d.family is not FAMILY:
        return
    spec, path, arch = d.spec, ctx.path, d.architecture
    ctx.summary["family"] = FAMILY.name
    stored = [i + 1 for i in spec.target_layer_ids]
    yield info(
        "eagle3.family",
        f"{path}: EAGLE-3 drafter: target layers {stored} (layer inputs; HF ids {list(spec.target_layer_ids)}), target "
        f"hidden size {spec.target_hidden_size}, draft vocabulary {spec.draft_vocab_size or spec.vocab_size} of "
        f"{spec.vocab_size}, norm_before_residual {bool(spec.norm_before_residual)}, norm_before_fc "
        f"{bool(spec.norm_before_fc)} — llama.cpp runs it with --spec-type {FAMILY.llama_cpp_spec_type} (it does not "
        "infer the type from the file) and drafts --spec-draft-n-max tokens a round (default 3)",
        target_layers=stored, target_hidden_size=spec.target_hidden_size,
        draft_vocab=spec.draft_vocab_size or spec.vocab_size, spec_type=FAMILY.llama_cpp_spec_type,
    )
    if len(spec.target_layer_ids) != N_TAPS:
        yield error(
            "eagle3.taps",
            f"{path}: {arch}.target_layers lists {len(stored)} layers {stored} but llama.cpp's draft-eagle3 fuses "
            f"exactly {N_TAPS} (it refuses the drafter: 'expected 3 extract layers, got {len(stored)}')",
            target_layers=stored,
        )
    fc = d.tensors.get(FC)
    width = N_TAPS * (spec.target_hidden_size or spec.hidden_size)
    if fc is not None and (len(fc.shape) != 2 or fc.shape[1] != width):
        yield error(
            "eagle3.fc_width",
            f"{path}: tensor '{fc.name}' is ne {{{', '.join(str(x) for x in reversed(fc.shape))}}} but "
            f"{arch}.target_hidden_size {spec.target_hidden_size} × {N_TAPS} taps needs ne0 = {width} — the file's "
            "metadata and its fc come from different drafters",
            shape=list(reversed(fc.shape)), expected_width=width,
        )
    norm = d.tensors.get(INPUT_NORM)
    if bool(spec.norm_before_fc) != (norm is not None):
        have = "has" if norm is not None else "has no"
        yield error(
            "eagle3.norm_before_fc",
            f"{path}: {arch}.norm_before_fc is {str(bool(spec.norm_before_fc)).lower()} but the file {have} "
            "enc.output_norm.weight — llama.cpp normalises the fused taps only with the flag (and needs the tensor "
            "then); re-convert with dflash-convert",
            norm_before_fc=bool(spec.norm_before_fc), has_tensor=norm is not None,
        )
