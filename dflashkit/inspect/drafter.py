"""Drafter metadata checks: dialect, required keys and their value types, tap ids, SWA pattern,
block size, the tensor set against the metadata, tokenizer presence, mask id.

Everything is read through the project's dialect tables and drafter reader, so a check here means
the same thing as the converter's validation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dflashkit.dialects import detect_dialect
from dflashkit.errors import DFlashError
from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.findings import Finding, error, info, warning
from dflashkit.drafters import DrafterFile, open_drafter
from dflashkit.spec import DrafterSpec, read_config_json
from dflashkit.spec_checks import POSITIVE_FIELDS, size_problems, value_problems
from dflashkit.families import FAMILIES, KNOWN_ARCHITECTURES
from dflashkit.families.tensor_set import tensor_set_problems
from dflashkit.variants import MASK_KEY, PRE_MERGE, PRE_MERGE_MASK_KEY, PRE_MERGE_TAPS_KEY, RAW_TAPS, RAW_TAPS_KEY, TAPS_KEY, detect_variant

MAX_BLOCK_SIZE = 64


def drafter_of(ctx: InspectContext) -> DrafterFile | None:
    """The file opened as a drafter (cached), or None when it is broken or not a drafter."""
    if "drafter" in ctx.cache:
        return ctx.cache["drafter"]
    drafter = None
    if not ctx.has_errors("gguf.") and not ctx.has_errors("safetensors."):
        try:
            drafter = open_drafter(ctx.path)
        except DFlashError:
            drafter = None
    ctx.cache["drafter"] = drafter
    return drafter


def is_drafter(ctx: InspectContext) -> bool:
    if ctx.gguf is not None:
        return detect_dialect(str(ctx.gguf.get("general.architecture", ""))) is not None
    d = drafter_of(ctx)
    return d is not None and (d.family is not None or d.architecture in KNOWN_ARCHITECTURES)


@register_check("drafter.metadata", kinds=("gguf",), order=200)
def check_gguf_metadata(ctx: InspectContext) -> Iterator[Finding]:
    assert ctx.gguf is not None
    arch = str(ctx.gguf.get("general.architecture", ""))
    dialect = detect_dialect(arch)
    if dialect is None:
        ctx.summary["dialect"] = None
        yield info(
            "drafter.not_a_drafter",
            f"{ctx.path}: general.architecture '{arch}' is not a DFlash drafter dialect — drafter checks skipped",
            architecture=arch,
        )
        return
    ctx.summary["dialect"] = dialect.name
    ctx.summary["tap_convention"] = dialect.tap_convention
    yield info(
        "drafter.dialect",
        f"{ctx.path}: {dialect.name} dialect ({dialect.description}); arch '{arch}'; target layer ids stored as "
        f"{dialect.tap_convention}",
        dialect=dialect.name, architecture=arch, tap_convention=dialect.tap_convention,
    )
    variant = detect_variant({k: kv.value for k, kv in ctx.gguf.kvs.items()})
    yield from _variant_findings(ctx, variant)
    # a pre-merge file's mask id and taps are under its own keys; the finding above says so
    moved = {MASK_KEY, TAPS_KEY} if variant == PRE_MERGE else set()
    missing = []
    for ks in dialect.keys:
        key = dialect.key(ks, arch)
        kv = ctx.gguf.kvs.get(key)
        if kv is None:
            if ks.required and key not in moved:
                missing.append(key)
            continue
        if kv.type != ks.type or (ks.sub_type is not None and kv.sub_type != ks.sub_type):
            want = ks.type.name + (f" of {ks.sub_type.name}" if ks.sub_type is not None else "")
            got = kv.type.name + (f" of {kv.sub_type.name}" if kv.sub_type is not None else "")
            yield error(
                "drafter.key_type",
                f"{ctx.path}: key '{key}' is {got} but the {dialect.name} loader needs {want} "
                "(other types are rejected or silently ignored) — re-convert with dflash-convert",
                key=key, expected=want, found=got,
            )
    if missing:
        yield error(
            "drafter.key_missing",
            f"{ctx.path}: required {dialect.name} key(s) missing: {', '.join(missing)} — re-convert with dflash-convert",
            keys=missing,
        )
    tokens = ctx.gguf.get("tokenizer.ggml.tokens")
    if ctx.gguf.get("tokenizer.ggml.model") is None:
        if dialect.needs_tokenizer:
            yield error(
                "drafter.tokenizer_missing",
                f"{ctx.path}: no tokenizer (tokenizer.ggml.model) — llama.cpp will refuse to load it "
                "('key not found in model: tokenizer.ggml.model'); re-convert with --target TARGET.gguf",
            )
        else:
            yield warning("drafter.tokenizer_missing", f"{ctx.path}: no tokenizer metadata (tokenizer.ggml.model)")
    drafter = drafter_of(ctx)
    if drafter is None:
        return
    if drafter.spec is None:
        if not missing:
            yield error("drafter.metadata_invalid", f"{ctx.path}: {drafter.spec_error}")
        return
    yield from _spec_checks(ctx, drafter, drafter.spec, n_tokens=len(tokens) if isinstance(tokens, list) else None)
    problem = drafter.weight_type_problem()
    if problem is not None:
        yield error("drafter.dtype", f"{problem} ({REFUSED_BY})")
    features_key = drafter.dialect.key_for_field("n_target_features", arch) if drafter.dialect else None
    if features_key is not None:
        features = ctx.gguf.get(features_key)
        if isinstance(features, int) and features != drafter.spec.fc_input_width:
            yield error(
                "drafter.n_target_features",
                f"{ctx.path}: {features_key} = {features} but {drafter.spec.n_taps} taps × "
                f"hidden {drafter.spec.hidden_size} = {drafter.spec.fc_input_width}",
                stored=features, expected=drafter.spec.fc_input_width,
            )
    taps_key = drafter.dialect.key_for_field("luce_n_target_layers", arch) if drafter.dialect else None
    if taps_key is not None and drafter.dialect is not None and not drafter.dialect.stores_target_count(arch):
        n = ctx.gguf.get(taps_key)
        if isinstance(n, int) and n != drafter.spec.n_taps:
            yield warning(
                "drafter.n_target_layers",
                f"{ctx.path}: {taps_key} = {n} but the file has {drafter.spec.n_taps} tap ids "
                "(Luce's Qwen loader reads it as the tap count)",
                stored=n, taps=drafter.spec.n_taps,
            )


def _variant_findings(ctx: InspectContext, variant: str | None) -> Iterator[Finding]:
    """The llama.cpp ``dflash`` variants in circulation (`dflashkit.variants`), with the command that fixes them."""
    assert ctx.gguf is not None
    if variant == PRE_MERGE:
        yield error(
            "drafter.pre_merge",
            f"{ctx.path}: pre-merge llama.cpp DFlash file ({PRE_MERGE_MASK_KEY} set, no {TAPS_KEY}) — current llama.cpp "
            f"refuses it (\"DFlash model requires 'target_layers' in GGUF metadata\"); fix: dflash-convert {ctx.path} "
            f"{ctx.path.with_suffix('.fixed.gguf')}",
            taps=ctx.gguf.get(PRE_MERGE_TAPS_KEY), mask_token_id=ctx.gguf.get(PRE_MERGE_MASK_KEY),
        )
    elif variant == RAW_TAPS:
        stored = ctx.gguf.get(TAPS_KEY)
        yield warning(
            "drafter.raw_tap_ids",
            f"{ctx.path}: carries {RAW_TAPS_KEY}, a key only tools that copy raw tap ids write (beellama's "
            f"convert-dflash-draft-to-upstream.py): {TAPS_KEY} {stored} probably tap one layer early; fix: "
            f"dflash-convert {ctx.path} {ctx.path.with_suffix('.fixed.gguf')} --taps-are-raw",
            target_layers=stored,
        )


@register_check("drafter.checkpoint", kinds=("safetensors",), order=200)
def check_checkpoint(ctx: InspectContext) -> Iterator[Finding]:
    if not ctx.path.is_dir():
        return
    drafter = drafter_of(ctx)
    if drafter is None:
        yield from _config_refused(ctx)
        return
    if drafter.family is None and drafter.spec_error and _has_drafter_tensors(ctx):
        # a drafter's tensors under a config no family reads (e.g. an empty architectures list): convert refuses it
        yield error("drafter.config_invalid", f"{drafter.spec_error} (dflash-convert refuses this checkpoint)")
        return
    if drafter.family is None and drafter.architecture not in KNOWN_ARCHITECTURES:
        yield info("drafter.not_a_drafter", f"{ctx.path}: config architecture '{drafter.architecture}' is not a DFlash drafter")
        return
    yield from _dtypes_refused(drafter)
    ctx.summary["dialect"] = "hf"
    ctx.summary["tap_convention"] = drafter.tap_convention
    if drafter.spec is None:
        yield error("drafter.config_invalid", drafter.spec_error or f"{ctx.path}: invalid config.json")
        return
    yield from _spec_checks(ctx, drafter, drafter.spec, n_tokens=drafter.spec.vocab_size)


#: Tensor dtypes dflash-convert reads (its _SAFETENSORS_FLOAT); any other fails here exactly as it fails there.
#: what a drafter.dtype finding adds: the commands that refuse such a file
REFUSED_BY = "dflash-convert, dflash-quantize, dflash-parity and dflash-accept refuse it"


_DRAFTER_ONLY = ("fc.weight", "hidden_norm.weight")


def _config_refused(ctx: InspectContext) -> Iterable[Finding]:
    """A drafter checkpoint (it has DFlash's own fc / hidden_norm tensors) whose config.json is missing or
    unreadable is refused by convert: an error here too. Other safetensors directories stay generic."""
    if ctx.has_errors("safetensors.") or not _has_drafter_tensors(ctx):
        return
    try:
        read_config_json(ctx.path)
    except DFlashError as exc:
        yield error("drafter.config_invalid", f"{exc} (dflash-convert refuses this checkpoint)")


def _has_drafter_tensors(ctx: InspectContext) -> bool:
    """The checkpoint has DFlash's own fc / hidden_norm tensors (a drafter, whatever its config says)."""
    return ctx.checkpoint is not None and any(
        f.hf_to_canonical(name) in _DRAFTER_ONLY for f in FAMILIES for name in ctx.checkpoint.tensors)


def _dtypes_refused(drafter: DrafterFile) -> Iterable[Finding]:
    # integer tensors a family converts itself (DSpark's d2t → I64 ids) or drops (t2d) are not weights
    problem = drafter.weight_type_problem()
    if problem is not None:
        yield error("drafter.dtype", f"{problem} ({REFUSED_BY})")


def _spec_checks(ctx: InspectContext, drafter: DrafterFile, spec: DrafterSpec, *, n_tokens: int | None) -> Iterable[Finding]:
    path = ctx.path
    # zero sizes (the block size has its own finding below): named as convert and parity name them;
    # nothing below is meaningful for them (shapes, tap widths divide by these)
    sizes = size_problems(spec, tuple(f for f in POSITIVE_FIELDS if f != "block_size"))
    for problem in sizes:
        yield error("drafter.sizes", f"{path}: {problem}")
    if sizes:
        return
    ids = list(spec.target_layer_ids)
    ctx.summary["target_layer_ids"] = ids
    if ids != sorted(set(ids)) or any(i < 0 for i in ids):
        yield error("drafter.tap_ids", f"{path}: target layer ids {ids} must be non-negative, sorted and unique", ids=ids)
    fc = drafter.tensors.get("fc.weight")
    if fc is not None and len(fc.shape) == 2 and fc.shape[1] != spec.fc_input_width:
        taps_from_fc = fc.shape[1] / spec.hidden_size
        yield error(
            "drafter.tap_count",
            f"{path}: {len(ids)} target layer ids but '{fc.name}' takes {fc.shape[1]} inputs = {taps_from_fc:g} × hidden "
            f"{spec.hidden_size}",
            ids=ids, fc_inputs=fc.shape[1], hidden=spec.hidden_size,
        )
    for problem in value_problems(spec):
        yield error("drafter.values", f"{path}: {problem}")
    if not 1 <= spec.block_size <= MAX_BLOCK_SIZE:
        yield error("drafter.block_size", f"{path}: block size {spec.block_size} is outside 1..{MAX_BLOCK_SIZE}", block_size=spec.block_size)
    if spec.sliding_window_pattern is not None:
        if len(spec.sliding_window_pattern) != spec.n_layers:
            yield error(
                "drafter.swa_pattern",
                f"{path}: sliding-window pattern has {len(spec.sliding_window_pattern)} entries for {spec.n_layers} layers",
                pattern=list(spec.sliding_window_pattern), layers=spec.n_layers,
            )
        if not spec.sliding_window:
            yield error("drafter.swa_window", f"{path}: a sliding-window pattern without a window size")
    if spec.mask_token_id is not None and n_tokens is not None and spec.mask_token_id >= n_tokens:
        yield error(
            "drafter.mask_token",
            f"{path}: mask token id {spec.mask_token_id} is outside the vocabulary ({n_tokens} tokens)",
            mask_token_id=spec.mask_token_id, vocab=n_tokens,
        )
    if drafter.unmapped:
        yield error(
            "drafter.tensor_unknown",
            f"{path}: {len(drafter.unmapped)} tensor(s) with no meaning in this dialect: {', '.join(drafter.unmapped[:8])}",
            tensors=drafter.unmapped,
        )
    shapes = {c: t.shape for c, t in drafter.tensors.items()}
    display = drafter.display_names()  # missing tensors named the way this file's dialect would
    for kind, message in tensor_set_problems(spec, shapes, source=str(path), display_names=display, family=drafter.family):
        yield error(f"drafter.tensor_{kind}", message)
