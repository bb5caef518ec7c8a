"""The three GGUF dialects of a DFlash drafter, as tables.

One `Dialect` per runtime lineage (facts in docs/dialects.md): architecture strings, metadata
keys with their GGUF value types, tensor names and the tap-id convention. The same table drives
writing (`encode_metadata`, `Dialect.gguf_name`) and reading (`decode_metadata`,
`Dialect.canonical_name`, `detect_dialect`) — there is no per-dialect branching elsewhere.

Canonical tensor ids are z-lab's HF names without a ``model.`` prefix (``fc.weight``,
``layers.3.self_attn.q_proj.weight``); the DFlash 2 codebooks always carry ``.weight``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from gguf import GGUFValueType

from . import bounds
from .errors import DFlashError
from .io.gguf_writer import MetadataEntry
from .families import family_for_gguf, family_llama_cpp_tensor_aliases, family_llama_cpp_tensor_names
from .spec import DrafterSpec, split_bid

T = GGUFValueType


def tap_ids_to_llama_cpp(target_layer_ids: Sequence[int]) -> list[int]:
    """HF ``target_layer_ids`` → llama.cpp ``dflash.target_layers``.

    HF ids count decoder layers and tap the hidden state that a layer *outputs*; llama.cpp
    indexes the hidden state that *enters* a layer, so layer id ``i`` is stored as ``i + 1``.
    Writing raw ids passes every shape check and silently collapses acceptance (each tap reads
    the layer below the one the drafter was trained on).
    """
    return [int(i) + 1 for i in target_layer_ids]


def tap_ids_from_llama_cpp(target_layers: Sequence[int]) -> list[int]:
    """Inverse of `tap_ids_to_llama_cpp`: llama.cpp ``target_layers`` → HF ``target_layer_ids``."""
    return [int(i) - 1 for i in target_layers]


# --------------------------------------------------------------------------------------------
# Tensor names
# --------------------------------------------------------------------------------------------

#: Canonical (HF) tensor ids → llama.cpp names. ``{bid}`` is the layer index.
_LLAMA_CPP_TENSORS: dict[str, str] = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "layers.{bid}.input_layernorm.weight": "blk.{bid}.attn_norm.weight",
    "layers.{bid}.self_attn.q_proj.weight": "blk.{bid}.attn_q.weight",
    "layers.{bid}.self_attn.k_proj.weight": "blk.{bid}.attn_k.weight",
    "layers.{bid}.self_attn.v_proj.weight": "blk.{bid}.attn_v.weight",
    "layers.{bid}.self_attn.o_proj.weight": "blk.{bid}.attn_output.weight",
    "layers.{bid}.self_attn.q_proj.bias": "blk.{bid}.attn_q.bias",
    "layers.{bid}.self_attn.k_proj.bias": "blk.{bid}.attn_k.bias",
    "layers.{bid}.self_attn.v_proj.bias": "blk.{bid}.attn_v.bias",
    "layers.{bid}.self_attn.o_proj.bias": "blk.{bid}.attn_output.bias",
    "layers.{bid}.self_attn.q_norm.weight": "blk.{bid}.attn_q_norm.weight",
    "layers.{bid}.self_attn.k_norm.weight": "blk.{bid}.attn_k_norm.weight",
    "layers.{bid}.post_attention_layernorm.weight": "blk.{bid}.ffn_norm.weight",
    "layers.{bid}.mlp.gate_proj.weight": "blk.{bid}.ffn_gate.weight",
    "layers.{bid}.mlp.up_proj.weight": "blk.{bid}.ffn_up.weight",
    "layers.{bid}.mlp.down_proj.weight": "blk.{bid}.ffn_down.weight",
    # a reduced draft vocabulary's map to target ids (speculators DFlash, DSpark)
    "d2t": "d2t",
    # attention sinks (llama.cpp's gguf-py: attn_sinks, F32 {n_head})
    "layers.{bid}.self_attn.sinks": "blk.{bid}.attn_sinks.weight",
}
#: What each family adds to llama.cpp's table (its own heads and layers, `DrafterFamily.llama_cpp_tensor_names`);
#: the other dialects' loaders have no names for them.
_FAMILY_TENSORS: dict[str, str] = family_llama_cpp_tensor_names()

#: tensors only llama.cpp's loader has names for (the Luce and dflash-draft loaders have none)
LLAMA_CPP_ONLY_TENSORS: frozenset[str] = frozenset({"layers.{bid}.self_attn.sinks", "d2t"})


def _template_regex(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(r"\{bid\}", r"(?P<bid>\d+)") + "$")


@dataclass(frozen=True)
class KeySpec:
    """One metadata key of a dialect: which spec field it carries and its GGUF value type."""

    field: str  # DrafterSpec field (or a derived quantity, see `_DERIVED`)
    key: str  # may contain {arch}
    type: GGUFValueType
    sub_type: GGUFValueType | None = None
    required: bool = False
    # Not read by that runtime's loader (it ignores unknown keys); written so that translating
    # between dialects never loses what the drafter means.
    extension: bool = False
    # Read by the table, written only by the families that own the key (`DrafterFamily.extra_metadata`,
    # in llama.cpp's position for that family): e.g. hidden_activation is Gemma-4 DSpark's, not DFlash's.
    family_only: bool = False


#: DFlash semantics a dialect has no key of its own for, stored under its arch prefix.
def _extension_keys(*fields_and_keys: tuple) -> tuple[KeySpec, ...]:
    return tuple(KeySpec(*row, extension=True) for row in fields_and_keys)


@dataclass(frozen=True)
class Dialect:
    name: str
    architectures: tuple[str, ...]  # accepted on read; the writer picks with `pick_architecture`
    keys: tuple[KeySpec, ...]
    tensor_names: Mapping[str, str]  # canonical → GGUF name template
    tensor_aliases: Mapping[str, str] = field(default_factory=dict)  # other GGUF names accepted on read
    tap_offset: int = 0  # stored id = HF id + tap_offset
    names_conv_selector: bool = False  # has names for per-layer convolutions and a candidate selector
    description: str = ""
    #: the runtime's loader refuses a file without ``tokenizer.ggml.model``
    needs_tokenizer: bool = False
    #: architectures whose ``luce_n_target_layers`` key holds the target's layer count (Luce's Gemma
    #: script); in the others it holds the tap count (Luce's Qwen script)
    target_count_architectures: tuple[str, ...] = ()
    #: the architecture string the writer uses for a spec
    architecture_for: Callable[[DrafterSpec], str] | None = field(default=None, compare=False)
    #: the key (template) after which ``general.file_type`` is written in a converted file; None:
    #: after the dialect's own keys
    file_type_after: str | None = None

    # ---- taps -----------------------------------------------------------------------------
    @property
    def tap_convention(self) -> str:
        return "HF id + 1 (llama.cpp)" if self.tap_offset == 1 else "raw HF ids"

    def taps_to_file(self, target_layer_ids: Sequence[int]) -> list[int]:
        return tap_ids_to_llama_cpp(target_layer_ids) if self.tap_offset == 1 else [int(i) for i in target_layer_ids]

    def taps_from_file(self, stored: Sequence[int]) -> list[int]:
        return tap_ids_from_llama_cpp(stored) if self.tap_offset == 1 else [int(i) for i in stored]

    # ---- tensor names ---------------------------------------------------------------------
    def gguf_name(self, canonical: str) -> str:
        """GGUF name of a canonical tensor id (``layers.3.mlp.up_proj.weight`` → ``blk.3.ffn_up.weight``)."""
        template, bid = split_bid(canonical)
        if template not in self.tensor_names:
            raise DFlashError(f"tensor '{canonical}' cannot be stored in the {self.name} dialect (it has no name for it)")
        out = self.tensor_names[template]
        return out.replace("{bid}", bid) if bid is not None else out

    def has_tensor(self, canonical: str) -> bool:
        return split_bid(canonical)[0] in self.tensor_names

    def canonical_name(self, gguf_name: str) -> str | None:
        """Canonical id of a GGUF tensor name in this dialect, or None when the name is not known."""
        for regex, template in self._read_patterns():
            m = regex.match(gguf_name)
            if m:
                bid = m.groupdict().get("bid")
                return template.replace("{bid}", bid) if bid is not None else template
        return None

    def _read_patterns(self) -> list[tuple[re.Pattern[str], str]]:
        cached = _PATTERN_CACHE.get(self.name)
        if cached is None:
            by_gguf = {v: k for k, v in self.tensor_names.items()}
            for alias, target in self.tensor_aliases.items():
                by_gguf[alias] = by_gguf[target]
            cached = [(_template_regex(g), c) for g, c in by_gguf.items()]
            _PATTERN_CACHE[self.name] = cached
        return cached

    def key(self, spec: KeySpec, arch: str) -> str:
        return spec.key.format(arch=arch)

    def pick_architecture(self, spec: DrafterSpec) -> str:
        return self.architecture_for(spec) if self.architecture_for is not None else self.architectures[0]

    def keys_field(self, field_name: str) -> bool:
        """Whether this dialect's table has a key for ``field_name``."""
        return any(ks.field == field_name for ks in self.keys)

    def key_for_field(self, field_name: str, arch: str) -> str | None:
        """The GGUF key carrying ``field_name`` in this dialect (None when it has none)."""
        for ks in self.keys:
            if ks.field == field_name:
                return self.key(ks, arch)
        return None

    def stores_target_count(self, arch: str) -> bool:
        """Whether ``luce_n_target_layers`` holds the target's layer count (else the tap count)."""
        return arch in self.target_count_architectures


_PATTERN_CACHE: dict[str, list[tuple[re.Pattern[str], str]]] = {}


# --------------------------------------------------------------------------------------------
# Metadata keys
# --------------------------------------------------------------------------------------------

_COMMON_HPARAMS = (
    KeySpec("context_length", "{arch}.context_length", T.UINT32, required=True),
    KeySpec("hidden_size", "{arch}.embedding_length", T.UINT32, required=True),
    KeySpec("n_layers", "{arch}.block_count", T.UINT32, required=True),
    KeySpec("intermediate_size", "{arch}.feed_forward_length", T.UINT32, required=True),
    KeySpec("n_heads", "{arch}.attention.head_count", T.UINT32, required=True),
    KeySpec("n_kv_heads", "{arch}.attention.head_count_kv", T.UINT32, required=True),
    KeySpec("head_dim", "{arch}.attention.key_length", T.UINT32, required=True),
    KeySpec("head_dim", "{arch}.attention.value_length", T.UINT32, required=True),
    KeySpec("rms_norm_eps", "{arch}.attention.layer_norm_rms_epsilon", T.FLOAT32, required=True),
    KeySpec("rope_theta", "{arch}.rope.freq_base", T.FLOAT32, required=True),
)

#: RoPE scaling as llama.cpp's converter writes it (``conversion/base.py`` ``set_gguf_parameters``), from
#: the spec's ``rope_scaling`` pairs (see `_derived_value`).
_ROPE_SCALING = (
    KeySpec("rope_scaling.type", "{arch}.rope.scaling.type", T.STRING),
    KeySpec("rope_scaling.factor", "{arch}.rope.scaling.factor", T.FLOAT32),
    KeySpec("rope_scaling.original_context_length", "{arch}.rope.scaling.original_context_length", T.UINT32),
    KeySpec("rope_scaling.ext_factor", "{arch}.rope.scaling.yarn_ext_factor", T.FLOAT32),
    KeySpec("rope_scaling.attn_factor", "{arch}.rope.scaling.yarn_attn_factor", T.FLOAT32),
    KeySpec("rope_scaling.beta_fast", "{arch}.rope.scaling.yarn_beta_fast", T.FLOAT32),
    KeySpec("rope_scaling.beta_slow", "{arch}.rope.scaling.yarn_beta_slow", T.FLOAT32),
)

_HPARAMS_BY_KEY = {ks.key: ks for ks in _COMMON_HPARAMS}


def _hparams(*names: str) -> tuple[KeySpec, ...]:
    """The common hparam rows ``{arch}.<name>``, in the order given (each dialect writes its own order)."""
    return tuple(_HPARAMS_BY_KEY["{arch}." + n] for n in names)


#: Keys the Luce and dflash-draft loaders share (under ``{arch}.dflash.`` / ``{arch}.attention.``)
_DRAFT_LOADER_KEYS = {
    ks.field: ks for ks in (
        KeySpec("block_size", "{arch}.dflash.block_size", T.UINT32, required=True),
        KeySpec("mask_token_id", "{arch}.dflash.mask_token_id", T.UINT32, required=True),
        # The Luce loader ignores target_layer_ids of any element type but INT32, and a non-BOOL pattern.
        KeySpec("target_layer_ids", "{arch}.dflash.target_layer_ids", T.ARRAY, T.INT32, required=True),
        KeySpec("sliding_window", "{arch}.attention.sliding_window", T.UINT32),
        KeySpec("sliding_window_pattern", "{arch}.attention.sliding_window_pattern", T.ARRAY, T.BOOL),
    )
}


def _draft_keys(*fields_: str) -> tuple[KeySpec, ...]:
    return tuple(_DRAFT_LOADER_KEYS[f] for f in fields_)


#: DFlash semantics neither the Luce nor the dflash-draft loader has a key for (written as extensions, after
#: each dialect's own first extension row)
_SHARED_EXTENSIONS = (
    ("embedding_scale", "{arch}.embedding_scale", T.FLOAT32),
    ("logit_scale", "{arch}.logit_scale", T.FLOAT32),
    ("attention_value_scale", "{arch}.attention.value_scale", T.FLOAT32),
    ("rope_dimension_count", "{arch}.rope.dimension_count", T.UINT32),
    ("rope_dimension_sections", "{arch}.rope.dimension_sections", T.ARRAY, T.INT32),
    ("hidden_act", "{arch}.hidden_activation", T.STRING),
    *((ks.field, ks.key, ks.type) for ks in _ROPE_SCALING),
)

# The llama.cpp dialect's keys in the order llama.cpp's converter writes them (TextModel's hparams,
# then DFlashModel's own; general.file_type goes after value_length, see `Dialect.file_type_after`).
LLAMA_CPP = Dialect(
    name="llama.cpp",
    architectures=("dflash",),
    description="upstream llama.cpp LLM_ARCH_DFLASH (also llama-cpp-python)",
    tap_offset=1,
    names_conv_selector=True,
    needs_tokenizer=True,
    tensor_names={**_LLAMA_CPP_TENSORS, **_FAMILY_TENSORS},
    # names written before llama.cpp settled them (zoo.md §2), per family: read, rewritten on translate
    tensor_aliases=family_llama_cpp_tensor_aliases(),
    file_type_after="{arch}.attention.value_length",
    keys=_hparams("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                  "attention.head_count_kv")
    + (
        # llama.cpp's TextModel writes a False `is_causal` here; DFlashModel's later write of the same key
        # keeps this position (gguf-py overwrites a duplicated key in place). True is written below.
        KeySpec("causal_false", "{arch}.attention.causal", T.BOOL),
    )
    + _ROPE_SCALING
    + _hparams("rope.freq_base", "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length")
    + (
        KeySpec("rope_dimension_count", "{arch}.rope.dimension_count", T.UINT32),
        KeySpec("attention_value_scale", "{arch}.attention.value_scale", T.FLOAT32),
        KeySpec("block_size", "{arch}.block_size", T.UINT32, required=True),
        KeySpec("conv_kernel_size", "{arch}.conv_kernel_size", T.UINT32),
        KeySpec("conv_group_size", "{arch}.conv_group_size", T.UINT32),
        KeySpec("selector_rank", "{arch}.selector_rank", T.UINT32),
        KeySpec("selector_top_k", "{arch}.selector_top_k", T.UINT32),
        KeySpec("logit_scale", "{arch}.logit_scale", T.FLOAT32),
        KeySpec("final_logit_softcapping", "{arch}.final_logit_softcapping", T.FLOAT32),
        KeySpec("embedding_scale", "{arch}.embedding_scale", T.FLOAT32),
        KeySpec("target_layer_ids", "{arch}.target_layers", T.ARRAY, T.INT32, required=True),
        KeySpec("sliding_window", "{arch}.attention.sliding_window", T.UINT32),
        KeySpec("sliding_window_pattern", "{arch}.attention.sliding_window_pattern", T.ARRAY, T.BOOL),
        KeySpec("causal", "{arch}.attention.causal", T.BOOL),
        KeySpec("rope_dimension_sections", "{arch}.rope.dimension_sections", T.ARRAY, T.INT32),
        # read by llama.cpp's loader (default SiLU); its converter writes it for Gemma-4 DSpark only
        KeySpec("hidden_act", "{arch}.hidden_activation", T.STRING),
        # DSpark / Gemma-4 DSpark (13B): written by those families in llama.cpp's order (`extra_metadata`)
        KeySpec("sample_from_anchor", "{arch}.sample_from_anchor", T.BOOL, family_only=True),
        KeySpec("has_confidence_head", "{arch}.has_confidence_head", T.BOOL, family_only=True),
        KeySpec("attention_scale", "{arch}.attention.scale", T.FLOAT32, family_only=True),
        # written after the tokenizer (llama.cpp's DFlashModel.set_vocab adds it last)
        KeySpec("mask_token_id", "tokenizer.ggml.mask_token_id", T.UINT32, required=True),
    ),
)

LUCE = Dialect(
    name="luce",
    architectures=("qwen35-dflash-draft", "gemma4-dflash-draft", "dflash-draft"),
    description="Luce-Org/lucebox draft_gguf_loader",
    tap_offset=0,
    names_conv_selector=False,
    target_count_architectures=("gemma4-dflash-draft",),
    architecture_for=lambda spec: _luce_arch(spec),
    tensor_names={
        **{k: v for k, v in _LLAMA_CPP_TENSORS.items() if k not in LLAMA_CPP_ONLY_TENSORS},
        "fc.weight": "dflash.fc.weight",
        "hidden_norm.weight": "dflash.hidden_norm.weight",
    },
    tensor_aliases={
        "dflash_fc.weight": "dflash.fc.weight",
        "dflash_hidden_norm.weight": "dflash.hidden_norm.weight",
        "blk.{bid}.post_attention_norm.weight": "blk.{bid}.ffn_norm.weight",
    },
    keys=_COMMON_HPARAMS
    + (
        KeySpec("vocab_size", "{arch}.vocab_size", T.UINT32),
        KeySpec("luce_n_target_layers", "{arch}.dflash.n_target_layers", T.UINT32, required=True),
    )
    + _draft_keys("block_size", "mask_token_id", "target_layer_ids", "sliding_window", "sliding_window_pattern")
    + (KeySpec("final_logit_softcapping", "{arch}.final_logit_softcapping", T.FLOAT32),)
    + _extension_keys(("causal", "{arch}.attention.causal", T.BOOL), *_SHARED_EXTENSIONS),
)

DFLASH_DRAFT = Dialect(
    name="dflash-draft",
    architectures=("dflash-draft",),
    description="Anbeeld / beellama.cpp / ht-llama.cpp lineage",
    tap_offset=0,
    names_conv_selector=False,
    tensor_names={
        **{k: v for k, v in _LLAMA_CPP_TENSORS.items() if k not in LLAMA_CPP_ONLY_TENSORS},
        "fc.weight": "dflash_fc.weight",
        "hidden_norm.weight": "dflash_hidden_norm.weight",
        "layers.{bid}.post_attention_layernorm.weight": "blk.{bid}.post_attention_norm.weight",
    },
    keys=_COMMON_HPARAMS
    + _draft_keys("target_layer_ids", "block_size", "mask_token_id")
    + (
        KeySpec("n_target_features", "{arch}.dflash.n_target_features", T.UINT32, required=True),
        KeySpec("causal", "{arch}.attention.causal", T.BOOL),
    )
    + _draft_keys("sliding_window", "sliding_window_pattern")
    + _extension_keys(("final_logit_softcapping", "{arch}.final_logit_softcapping", T.FLOAT32), *_SHARED_EXTENSIONS),
)

DIALECTS: dict[str, Dialect] = {d.name: d for d in (LLAMA_CPP, LUCE, DFLASH_DRAFT)}
DEFAULT_DIALECT = LLAMA_CPP


def _luce_arch(spec: DrafterSpec) -> str:
    # Gemma-4 drafters are the ones with logit softcapping / a scaled input embedding.
    gemma = spec.final_logit_softcapping is not None or spec.embedding_scale is not None
    return "gemma4-dflash-draft" if gemma else "qwen35-dflash-draft"


def get_dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise DFlashError(f"unknown dialect '{name}' (known: {', '.join(DIALECTS)})") from None


def detect_dialect(architecture: str | None) -> Dialect | None:
    """Dialect of a GGUF from its ``general.architecture`` (None when it is no DFlash drafter)."""
    for dialect in DIALECTS.values():
        if architecture in dialect.architectures and dialect.name != "luce":
            return dialect
    # "dflash-draft" is also accepted by the Luce loader, but its keys are the dflash-draft lineage's.
    return LUCE if architecture in LUCE.architectures else None


# --------------------------------------------------------------------------------------------
# Encoding / decoding metadata
# --------------------------------------------------------------------------------------------


def _derived_value(field_name: str, spec: DrafterSpec, arch: str, dialect: Dialect) -> Any:
    if field_name == "causal_false":  # llama.cpp's early position of a False causal flag
        return False if spec.causal is False else None
    if field_name == "causal" and dialect.keys_field("causal_false"):
        return True if spec.causal else None
    if field_name.startswith("rope_scaling."):
        return dict(spec.rope_scaling).get(field_name.split(".", 1)[1]) if spec.rope_scaling else None
    if field_name == "n_target_features":
        return spec.fc_input_width
    if field_name == "luce_n_target_layers":
        # Luce's Qwen script stores the tap count, its Gemma script the target's layer count.
        return spec.num_target_layers if dialect.stores_target_count(arch) else spec.n_taps
    return getattr(spec, field_name)


def encode_metadata(
    spec: DrafterSpec, dialect: Dialect, arch: str | None = None, *, skip: Iterable[str] = ()
) -> list[MetadataEntry]:
    """The dialect's metadata entries for ``spec`` (architecture and general.* not included).

    ``skip``: spec fields left out (the drafter's family writes them itself, `DrafterFamily.metadata_fields`).
    Raises a DFlashError naming the key when a required value is unknown.
    """
    arch = arch or dialect.pick_architecture(spec)
    skipped = frozenset(skip)
    entries: list[MetadataEntry] = []
    for ks in dialect.keys:
        if ks.field in skipped or ks.family_only:
            continue
        value = _derived_value(ks.field, spec, arch, dialect)
        key = dialect.key(ks, arch)
        if value is None:
            if ks.required:
                raise DFlashError(_missing_value_message(ks, key, dialect))
            continue
        if ks.field == "target_layer_ids":
            value = dialect.taps_to_file(value)
        if ks.type == T.ARRAY:
            value = list(value)
        elif ks.type == T.FLOAT32:
            value = float(value)
        elif ks.type == T.BOOL:
            value = bool(value)
        elif ks.type == T.STRING:
            value = str(value)
        else:
            value = int(value)
        entries.append(MetadataEntry(key, value, ks.type, ks.sub_type))
    return entries


def _missing_value_message(ks: KeySpec, key: str, dialect: Dialect) -> str:
    hints = {
        "mask_token_id": "set dflash_config.mask_token_id in config.json or pass --mask-token-id",
        "luce_n_target_layers": "pass --target (the target model) or --num-target-layers",
        "num_target_layers": "pass --target (the target model) or --num-target-layers",
    }
    fix = hints.get(ks.field, f"the source does not carry '{ks.field}'")
    return f"the {dialect.name} dialect requires '{key}' but its value is unknown — {fix}"


def decode_metadata(kvs: Mapping[str, Any], dialect: Dialect, arch: str) -> dict[str, Any]:
    """Read the dialect's keys from ``kvs`` (key → value) into spec fields (HF tap convention).

    Returns only the fields present; derived keys come back under their own names
    (``n_target_features``, ``luce_n_target_layers``).
    """
    out: dict[str, Any] = {}
    for ks in dialect.keys:
        key = dialect.key(ks, arch)
        if key not in kvs:
            continue
        value = bounds.metadata_value(kvs[key], key, ks.field, ks.type.name, ks.sub_type.name if ks.sub_type else None)
        if ks.field == "target_layer_ids":
            value = tuple(dialect.taps_from_file(value))
        elif ks.field == "sliding_window_pattern":
            value = tuple(bool(v) for v in value)
        elif ks.field == "rope_dimension_sections":
            value = tuple(int(v) for v in value)
        if ks.field in out and out[ks.field] != value:
            # key_length and value_length both map to head_dim; keep the first and flag the mismatch
            out.setdefault("_conflicts", []).append((ks.field, key, value))
            continue
        out[ks.field] = value
    return out


def spec_from_gguf_metadata(kvs: Mapping[str, Any], dialect: Dialect, arch: str, *, name: str | None = None) -> DrafterSpec:
    """Build a DrafterSpec from a GGUF's metadata. Missing required keys raise DFlashError."""
    fields_ = decode_metadata(kvs, dialect, arch)
    missing = [dialect.key(ks, arch) for ks in dialect.keys if ks.required and dialect.key(ks, arch) not in kvs]
    if missing:
        raise DFlashError(f"missing {dialect.name} metadata key(s): {', '.join(missing)}")
    n_target_layers = fields_.get("num_target_layers")
    if dialect.stores_target_count(arch):
        n_target_layers = fields_.get("luce_n_target_layers")

    spec = DrafterSpec(
        # the family's GGUF signature (DFlash 2: the conv keys) gives the HF architecture back
        architecture=family_for_gguf(fields_).architectures[0],
        hidden_size=int(fields_["hidden_size"]),
        n_layers=int(fields_["n_layers"]),
        n_heads=int(fields_["n_heads"]),
        n_kv_heads=int(fields_["n_kv_heads"]),
        head_dim=int(fields_["head_dim"]),
        intermediate_size=int(fields_["intermediate_size"]),
        rms_norm_eps=float(fields_["rms_norm_eps"]),
        rope_theta=float(fields_["rope_theta"]),
        context_length=int(fields_["context_length"]),
        block_size=int(fields_["block_size"]),
        target_layer_ids=tuple(fields_["target_layer_ids"]),
        mask_token_id=fields_.get("mask_token_id"),
        vocab_size=fields_.get("vocab_size"),
        num_target_layers=n_target_layers,
        sliding_window=fields_.get("sliding_window"),
        sliding_window_pattern=fields_.get("sliding_window_pattern"),
        causal=fields_.get("causal"),
        final_logit_softcapping=fields_.get("final_logit_softcapping"),
        embedding_scale=fields_.get("embedding_scale"),
        logit_scale=fields_.get("logit_scale"),
        attention_value_scale=fields_.get("attention_value_scale"),
        rope_dimension_count=fields_.get("rope_dimension_count"),
        rope_dimension_sections=fields_.get("rope_dimension_sections"),
        conv_kernel_size=fields_.get("conv_kernel_size"),
        conv_group_size=fields_.get("conv_group_size"),
        selector_rank=fields_.get("selector_rank"),
        selector_top_k=fields_.get("selector_top_k"),
        name=name,
        rope_scaling=tuple((k.split(".", 1)[1], v) for k, v in fields_.items() if k.startswith("rope_scaling.")) or None,
        # DSpark (heads and draft vocabulary come from the tensors: `DrafterFamily.refine_spec`)
        sample_from_anchor=fields_.get("sample_from_anchor"),
        has_confidence_head=fields_.get("has_confidence_head"),
        attention_scale=fields_.get("attention_scale"),
        hidden_act=fields_.get("hidden_act"),
    )
    return spec


def with_spec(spec: DrafterSpec, **changes: Any) -> DrafterSpec:
    return replace(spec, **changes)


def all_keys(dialect: Dialect, arch: str) -> Iterable[str]:
    return (dialect.key(ks, arch) for ks in dialect.keys)
