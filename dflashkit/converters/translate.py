"""GGUF → GGUF translation between DFlash dialects (llama.cpp, luce, dflash-draft).

Tensor bytes are copied untouched (any quant type); names and metadata are rewritten through the
dialect tables, tap ids converted between conventions. What the source lacks and the output
dialect requires comes from ``--target`` or an explicit flag — never from a guessed default.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import Callable, Iterator, Sequence

import numpy as np
from gguf import GGUFValueType

from .. import bounds
from ..codecs.values import StoredScan, ValueCounts
from ..dialects import Dialect, get_dialect
from ..drafters import DrafterFile, open_drafter
from ..errors import DFlashError, UsageError
from ..io.gguf_writer import MetadataEntry, TensorToWrite, check_output_path, write_gguf
from ..spec import DrafterSpec
from ..variants import PRE_MERGE, RAW_TAPS, RAW_TAPS_KEY, TAPS_KEY
from .plan import ConvertResult, PlannedTensor, build_metadata, validate

_COPY_CHUNK = 16 << 20


def _tokenizer_entries(drafter: DrafterFile) -> list[MetadataEntry]:
    assert drafter._gguf is not None
    return [
        MetadataEntry(kv.key, kv.value, kv.type, kv.sub_type)
        for kv in drafter._gguf.kvs.values()
        if kv.key.startswith("tokenizer.")
    ]


def _raw_copy(drafter: DrafterFile, canonical: str) -> Callable[[], Iterator[np.ndarray]]:
    def chunks() -> Iterator[np.ndarray]:
        raw = drafter.read_raw(canonical).reshape(-1).view(np.uint8)
        for start in range(0, raw.size, _COPY_CHUNK):
            yield np.array(raw[start : start + _COPY_CHUNK])  # copy out of the map: bounded RSS

    return chunks


def _fix_tap_convention(drafter: DrafterFile, spec: DrafterSpec, src: str, taps_are_raw: bool) -> DrafterSpec:
    """Apply ``--taps-are-raw``; refuse a raw-tap ``dflash`` file without it."""
    stored = drafter.metadata.get(TAPS_KEY)
    if taps_are_raw:
        if drafter.dialect is None or drafter.dialect.tap_offset != 1 or drafter.variant == PRE_MERGE:
            raise UsageError(
                f"{src}: --taps-are-raw applies to a current-layout llama.cpp 'dflash' file (this one's tap ids "
                f"are read as {drafter.tap_convention if drafter.variant != PRE_MERGE else 'raw HF ids'} already)"
            )
        return replace(spec, target_layer_ids=tuple(i + 1 for i in spec.target_layer_ids))
    if drafter.variant == RAW_TAPS:
        raise DFlashError(
            f"{src}: carries {RAW_TAPS_KEY}, a key only tools that copy raw tap ids write (beellama's "
            f"convert-dflash-draft-to-upstream.py), so {TAPS_KEY} {stored} probably tap one layer early — "
            "pass --taps-are-raw to store them + 1"
        )
    return spec


def translate_gguf(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    dialect: str,
    target: str | os.PathLike | None = None,
    num_target_layers: int | None = None,
    mask_token_id: int | None = None,
    taps_are_raw: bool = False,
    target_layer_ids: Sequence[int] | None = None,
    force: bool = False,
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
    strict: bool = False,
) -> ConvertResult:
    """Rewrite a drafter GGUF in another dialect (or the same one, normalised). NaN / inf values are counted and
    warned about (``strict``: refused, nothing written).

    The llama.cpp ``dflash`` variants in circulation (`dflashkit.variants`) come out in the current
    layout: a pre-merge file as read (mask id and taps moved), a raw-tap file only with
    ``taps_are_raw`` (its stored ids + 1) — without it such a file is refused."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    out_path = check_output_path(out, force=force, inputs=[src] + ([target] if target else []))
    table: Dialect = get_dialect(dialect)
    drafter = open_drafter(src)
    if drafter.kind != "gguf":
        raise UsageError(f"{src}: not a GGUF file")
    with drafter:
        spec = drafter.require_spec()
        if (problem := drafter.weight_type_problem()) is not None:
            raise DFlashError(f"{problem} — refusing to convert it")
        if drafter.unmapped:
            shown = ", ".join(bounds.escape_name(n) for n in drafter.unmapped[:10])
            raise DFlashError(
                f"{src}: {len(drafter.unmapped)} tensor(s) with no meaning in the {drafter.dialect.name if drafter.dialect else '?'} "
                f"dialect: {shown} — refusing to drop them"
            )
        spec = _fix_tap_convention(drafter, spec, str(src), taps_are_raw)
        if target_layer_ids is not None and list(target_layer_ids) != list(spec.target_layer_ids):
            raise DFlashError(
                f"{src}: --target-layer-ids {','.join(str(i) for i in target_layer_ids)} contradicts the file's "
                f"target layers {list(spec.target_layer_ids)} (HF ids) — a GGUF keeps its own taps"
            )
        # the checks a conversion runs, in the same place and order
        checked = validate(
            spec, source=str(src), dialect=table, shapes={c: t.shape for c, t in drafter.tensors.items()},
            display=drafter.display_names(), overrides={"num_target_layers": num_target_layers,
                                                        "mask_token_id": mask_token_id}, target=target,
            family=drafter.family,
        )
        spec, target_info = checked.spec, checked.target
        tokenizer = _tokenizer_entries(drafter)
        if not any(e.key == "tokenizer.ggml.model" for e in tokenizer) and target_info is not None and target_info.tokenizer:
            tokenizer = list(target_info.tokenizer.entries)
            warn(f"{src} has no tokenizer: copied the one of {target_info.path}")
        if table.needs_tokenizer and not any(e.key == "tokenizer.ggml.model" for e in tokenizer):
            raise DFlashError(
                f"{src}: has no tokenizer, which the {table.name} dialect requires — pass --target TARGET.gguf "
                "(or the target's HF dir) to copy it"
            )

        arch = table.pick_architecture(spec)
        file_type = bounds.int_value(drafter.metadata.get("general.file_type", 0), "general.file_type", str(src))
        # the source's general.* block (type, name, size label, provenance ...) is kept as it is
        general = [
            MetadataEntry(kv.key, kv.value, kv.type, kv.sub_type)
            for kv in drafter._gguf.kvs.values()  # type: ignore[union-attr]
            if kv.key.startswith("general.")
        ]
        metadata = build_metadata(spec, drafter.family, table, arch, file_type=file_type, tokenizer=tokenizer,
                                  general=general)
        qv = drafter.metadata.get("general.quantization_version")
        if qv is not None:
            metadata = [
                MetadataEntry(e.key, bounds.int_value(qv, "general.quantization_version", str(src)), GGUFValueType.UINT32)
                if e.key == "general.quantization_version" else e
                for e in metadata
            ]

        plan = []
        tensors = []
        counts = ValueCounts(str(src), strict)
        # tensors keep the source's order: a translation is a copy (and HF -> A -> B -> llama.cpp then
        # equals HF -> llama.cpp whatever the checkpoint's shard layout was)
        for canonical in drafter.tensors:
            ref = drafter.tensors[canonical]
            name = table.gguf_name(canonical)
            assert ref.ggml_type is not None
            plan.append(PlannedTensor(canonical, name, ref.name, ref.shape, ref.ggml_type, ref.type_name))
            tensors.append(TensorToWrite(name, ref.shape, ref.ggml_type, _raw_copy(drafter, canonical)))
        # a copy keeps NaN / inf: counted from the stored bits beside the write (--strict refuses them)
        gguf_file = drafter._gguf  # type: ignore[union-attr]
        copied = StoredScan(counts, [(p.source_name, src, gguf_file.tensors[p.source_name].offset,
                                      gguf_file.tensors[p.source_name].nbytes, p.source_type) for p in plan])
        try:
            size = write_gguf(out_path, arch, metadata, tensors, force=force, progress=progress,
                              before_publish=copied.finish)
        finally:
            copied.cancel()
    warnings = counts.warnings([p.source_name for p in plan])
    for w in warnings:
        warn(w)
    return ConvertResult(out_path, table.name, arch, "copy", file_type, size, plan, metadata, spec,
                         str(target) if target is not None else None, warnings)
