"""Planning a drafter GGUF: what conversion (HF → GGUF) and translation (GGUF → GGUF) share.

From a `DrafterSpec` and a source's canonical tensors: the spec and tensor-set checks (the same
ones for both commands, so a translated file is refused exactly where a conversion would be; the
spec rules themselves live in `dflashkit.spec_checks`, shared with Parity and Accept), the
drafter ↔ target rules (`dflashkit.target_rules`), what only the target tells, the metadata in
llama-quantize's order, and the tensor order. `convert.py` and `translate.py` are thin commands
over this module; neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from gguf import GGMLQuantizationType, GGUFValueType

from ..dialects import Dialect, encode_metadata
from ..errors import DFlashError
from ..families import DrafterFamily
from ..filetypes import CONVERT_OUTTYPES, outtype_file_type
from ..families.tensor_set import check_tensor_set
from ..io.gguf_writer import QUANTIZATION_VERSION, MetadataEntry, llama_tensor_order_key
from ..spec import DrafterSpec
from ..spec_checks import check_spec, require_mask_in_vocab
from ..target_rules import check_target_compatibility
from .target import TargetInfo, load_target


@dataclass
class PlannedTensor:
    canonical: str
    gguf_name: str
    source_name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    source_type: str
    note: str | None = None  # why the type differs from the requested one

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.gguf_name,
            "source": self.source_name,
            "shape": list(self.shape),
            "source_type": self.source_type,
            "type": self.ggml_type.name,
            **({"note": self.note} if self.note else {}),
        }


@dataclass
class ConvertResult:
    out: Path
    dialect: str
    architecture: str
    outtype: str
    file_type: int
    bytes_written: int
    tensors: list[PlannedTensor]
    metadata: list[MetadataEntry]
    spec: DrafterSpec
    target: str | None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        types: dict[str, int] = {}
        for t in self.tensors:
            types[t.ggml_type.name] = types.get(t.ggml_type.name, 0) + 1
        return {
            "out": str(self.out),
            "dialect": self.dialect,
            "architecture": self.architecture,
            "outtype": self.outtype,
            "file_type": self.file_type,
            "bytes": self.bytes_written,
            "tensor_count": len(self.tensors),
            "tensor_types": types,
            "tensors": [t.summary() for t in self.tensors],
            "metadata": {m.key: _json_value(m) for m in self.metadata},
            "target": self.target,
            "warnings": self.warnings,
        }


def _json_value(entry: MetadataEntry) -> Any:
    v = entry.value
    if entry.type == GGUFValueType.ARRAY and hasattr(v, "__len__") and len(v) > 16:
        return f"[{len(v)} × {entry.sub_type.name if entry.sub_type else '?'}]"
    return v


# ---------------------------------------------------------------------------------------------
# Checks shared by conversion and translation (the spec rules themselves: `spec_checks.check_spec`
# and `spec_checks.require_mask_in_vocab`, which both commands call)
# ---------------------------------------------------------------------------------------------


def check_dialect_holds(family: DrafterFamily, dialect: Dialect, source: str, *, hint: str = "") -> None:
    """A dialect without names for per-layer convolutions and a candidate selector cannot hold a drafter
    whose family has them (DFlash 2)."""
    if family.conv_selector and not dialect.names_conv_selector:
        raise DFlashError(
            f"{source}: a DFlash 2 drafter cannot be written in the {dialect.name} dialect "
            f"(it has no conv/selector tensors){hint}"
        )


def check_tensors(spec: DrafterSpec, shapes: Mapping[str, tuple[int, ...]], source: str, display: Mapping[str, str],
                  family: DrafterFamily | None = None) -> None:
    """The source's canonical tensors against the spec's family (first mismatch is the error)."""
    check_tensor_set(spec, shapes, source=source, display_names=display, family=family)


def target_uses_mrope(target: TargetInfo) -> bool:
    """Whether the target ropes with M-RoPE sections (Qwen3.5/3.6): its config's rope parameters
    carry ``mrope_section``, or its GGUF has ``{arch}.rope.dimension_sections``."""
    if target.kind == "gguf":
        return f"{target.architecture}.rope.dimension_sections" in target.metadata
    config = target.metadata.get("text_config") or target.metadata
    config = config if isinstance(config, dict) else target.metadata  # text_config: [1] is no text config
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return isinstance(rope, dict) and "mrope_section" in rope


def spec_with_target(spec: DrafterSpec, target: TargetInfo, dialect: Dialect) -> DrafterSpec:
    """Check the drafter against its target, then fill what only the target tells: its layer
    count, its vocabulary size and (M-RoPE targets) the rope sections. Used by conversion and
    translation alike."""
    check_target_compatibility(spec, target)
    if spec.num_target_layers is None:
        spec = replace(spec, num_target_layers=target.n_layers)
    if spec.vocab_size is None:
        spec = replace(spec, vocab_size=target.vocab_size)
    if spec.rope_dimension_sections is None and target_uses_mrope(target):
        # as llama.cpp's converter: the drafter ropes on the temporal section only
        spec = replace(spec, rope_dimension_sections=(spec.head_dim // 2, 0, 0, 0))
    return spec


@dataclass
class Validated:
    """A source that passed every check: its spec (overrides and the target's facts applied), its target and
    the family's final tensors (checked and rewritten, e.g. DSpark's absolute ``d2t``)."""

    spec: DrafterSpec
    target: TargetInfo | None
    finals: dict[str, tuple[Any, GGMLQuantizationType]]


def validate(
    spec: DrafterSpec, *, source: str, dialect: Dialect, shapes: Mapping[str, tuple[int, ...]],
    display: Mapping[str, str], overrides: Mapping[str, int | None], family: DrafterFamily, target: Any = None,
    read_raw: Callable[[str], Any] | None = None, mask_source: str | None = None, hint: str = "",
) -> Validated:
    """Every check of a conversion or a translation, in one place and one pass, in the order their errors are
    reported: the dialect can hold the drafter, the flags agree with the source, the spec rules, the family's
    rules on its tensors, the tensor set, the family's final tensors, the drafter ↔ target rules (with the target
    loaded) and the mask token. The first broken check is a one-line DFlashError; nothing is written before.

    ``family``: the family that read the source (`DrafterFile.family`): the registry is asked once, when the
    source opens, and every check and the caller's `build_metadata` use that one. ``read_raw`` (a conversion: the
    source's raw tensors): the family's hooks also check the source's own tensors and finalize them."""
    check_dialect_holds(family, dialect, source, hint=hint)
    target_info = None
    if family.needs_target:  # the target completes the spec (default taps, its hidden size) before it is checked
        if target is None:
            raise DFlashError(f"{source}: a {family.label(spec.layout)} drafter converts with its target: pass "
                              "--target TARGET_HF_DIR or TARGET.gguf (llama.cpp's converter reads its vocabulary, "
                              "hidden size, layer count and tokenizer from --target-model-dir)")
        target_info = load_target(target)
        spec = family.with_target(spec, target_info, source)
    spec = apply_overrides(spec, source, **overrides)
    check_spec(spec, source)
    if read_raw is not None:
        family.check_source(spec, shapes, source)  # first: names the family's key (d2t, lm_head)
    check_tensors(spec, shapes, source, display, family)
    finals = {}
    if read_raw is not None:
        finals = {c: family.finalize_tensor(spec, c, read_raw(c), source) for c in family.final_tensors if c in shapes}
    if target_info is None and target is not None:
        target_info = load_target(target)
    if target_info is not None:
        spec = spec_with_target(spec, target_info, dialect)
    require_mask_in_vocab(spec, mask_source or source)
    return Validated(spec, target_info, finals)


def apply_overrides(
    spec: DrafterSpec,
    source: str,
    *,
    num_target_layers: int | None = None,
    mask_token_id: int | None = None,
) -> DrafterSpec:
    """Fill values the source lacks from explicit flags; a flag contradicting the source is an error."""
    for field_name, flag, value in (
        ("num_target_layers", "--num-target-layers", num_target_layers),
        ("mask_token_id", "--mask-token-id", mask_token_id),
    ):
        if value is None:
            continue
        current = getattr(spec, field_name)
        if current is not None and current != value:
            raise DFlashError(f"{source}: {flag} {value} contradicts the source's {field_name} = {current}")
        spec = replace(spec, **{field_name: value})
    return spec


# ---------------------------------------------------------------------------------------------
# Metadata and tensor order
# ---------------------------------------------------------------------------------------------


#: general.file_type values llama.cpp's converter writes (f32, f16, bf16, q8_0): files of these types
#: are laid out as the converter lays them out; any other (K-quants) as llama-quantize leaves them.
CONVERTER_FILE_TYPES: frozenset[int] = frozenset(outtype_file_type(o).file_type for o in CONVERT_OUTTYPES)
#: keys every writer sets itself (never copied from a source's general.* block)
_WRITER_KEYS = frozenset({"general.architecture", "general.file_type", "general.quantization_version", "general.alignment"})


def converter_layout(file_type: int) -> bool:
    """Whether a file of ``file_type`` is written in llama.cpp's converter order (else llama-quantize's)."""
    return file_type in CONVERTER_FILE_TYPES


def build_metadata(
    spec: DrafterSpec,
    family: DrafterFamily,
    dialect: Dialect,
    arch: str,
    *,
    file_type: int,
    tokenizer: Sequence[MetadataEntry] = (),
    general: Sequence[MetadataEntry] = (),
) -> list[MetadataEntry]:
    """Every metadata entry of a drafter GGUF, in the order llama.cpp writes them.

    Converter order (f32/f16/bf16/q8_0, `converter_layout`): ``general`` (general.type, name,
    size_label ... from `converters.general`), the dialect's keys in table order with
    general.file_type after `Dialect.file_type_after`, the family's extra keys,
    general.quantization_version, the tokenizer, then the dialect's own ``tokenizer.*`` keys
    (llama.cpp adds the mask token id last). llama-quantize order (every other file type): the same
    with general.quantization_version and general.file_type moved to the end, as llama-quantize
    re-sets them. So a conversion, a translation and a conversion + quantization of the same
    drafter are byte-identical to what llama.cpp's tools make of it. ``family``: the spec's family, as the
    source's reader resolved it (`DrafterFile.family`).
    """
    drafter = encode_metadata(spec, dialect, arch, skip=family.metadata_fields)
    leading_keys = {dialect.key(ks, arch) for ks in dialect.keys if ks.leading}
    after_keys = {dialect.key(ks, arch) for ks in dialect.keys if ks.after_file_type}
    leading = [e for e in drafter if e.key in leading_keys]
    body = [e for e in drafter if not e.key.startswith("tokenizer.") and e.key not in leading_keys]
    last = [e for e in drafter if e.key.startswith("tokenizer.")]
    file_type_entry = MetadataEntry("general.file_type", file_type, GGUFValueType.UINT32)
    position = len(body)
    if after_keys:
        position = next((i for i, e in enumerate(body) if e.key in after_keys), position)
    elif dialect.file_type_after is not None:
        anchor = dialect.file_type_after.format(arch=arch)
        position = next((i + 1 for i, e in enumerate(body) if e.key == anchor), position)
    body.insert(position, file_type_entry)
    body.extend(family.extra_metadata(spec, dialect, arch))
    quant_version = MetadataEntry("general.quantization_version", QUANTIZATION_VERSION, GGUFValueType.UINT32)
    head = [e for e in general if e.key not in _WRITER_KEYS]
    own = {e.key for e in head} | {e.key for e in body} | {e.key for e in last} | leading_keys | _WRITER_KEYS
    # the drafter's own keys (e.g. tokenizer.ggml.mask_token_id) win over the target's
    vocab = [MetadataEntry(e.key, e.value, e.type, e.sub_type) for e in tokenizer if e.key not in own]
    entries = leading + head + body + [quant_version] + vocab + last
    if not converter_layout(file_type):
        entries = [e for e in entries if e.key not in ("general.quantization_version", "general.file_type")]
        entries += [quant_version, file_type_entry]
    return entries


def ordered_canonical(
    names: Iterable[str],
    dialect: Dialect,
    *,
    file_type: int,
    source_order: Callable[[str], Any] | None = None,
) -> list[str]:
    """Canonical ids in output order.

    Converter order (`converter_layout`): llama.cpp's converter writes tensors in the order it reads
    them — checkpoint parts in name order, each part's tensors sorted by name (gguf-py's
    ``SafetensorsLocal``) — so ``source_order`` gives each id's (part, HF name) key; without one
    the canonical ids are sorted (the same order for a one-part z-lab checkpoint).
    llama-quantize order (other file types): its loader's (layer, then name). Translation keeps its
    source's order and does not call this.
    """
    if converter_layout(file_type):
        return sorted(names, key=source_order) if source_order is not None else sorted(names)
    return sorted(names, key=lambda c: llama_tensor_order_key(dialect.gguf_name(c)))
