"""What a dialect table is: `Dialect` (architectures, `KeySpec` metadata rows, tensor-name templates, the tap-id
convention) and the one conversion of tap ids between HF and llama.cpp.

The shared machinery every dialect's table is an instance of; the tables themselves are in `llama_cpp`, `luce` and
`dflash_draft`, what reads and writes metadata with them in `metadata`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from gguf import GGUFValueType

from ..errors import DFlashError
from ..spec import DrafterSpec, split_bid

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
    # written before general.* (llama.cpp's converter writes a few keys from the model's __init__)
    leading: bool = False
    # written after general.file_type (llama.cpp's model class adds it after TextModel's keys)
    after_file_type: bool = False


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
    #: its consumer reads one causal flag for every layer of the draft context and counts a window on the past side
    #: only (llama.cpp: `dflashkit.causality`); the runtime runs its files so, and a converter says what that loses
    one_causal_flag: bool = False

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
        cached = _PATTERN_CACHE.get((self.name, self.architectures))
        if cached is None:
            by_gguf = {v: k for k, v in self.tensor_names.items()}
            for alias, target in self.tensor_aliases.items():
                by_gguf[alias] = by_gguf[target]
            cached = [(_template_regex(g), c) for g, c in by_gguf.items()]
            _PATTERN_CACHE[(self.name, self.architectures)] = cached
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


_PATTERN_CACHE: dict[tuple[str, tuple[str, ...]], list[tuple[re.Pattern[str], str]]] = {}
