"""Per-tensor type policy of llama.cpp's ``llama-quantize``, shared by ``dflash-quantize`` and ``dflash-convert``.

Mirrors ``src/llama-quant.cpp`` (identical in both pinned builds): ``llama_ftype_get_default_type`` (file type ->
default ggml type), ``tensor_allows_quantization`` (which tensors are touched at all), ``tensor_get_category``,
``llama_tensor_get_type`` / ``llama_tensor_get_type_impl`` (the mixes of Q2_K, Q2_K_S, Q3_K_S/M/L, IQ4_NL,
IQ4_XS, Q4_0 / Q5_0 with an importance matrix, Q4_K_S/M and Q5_K_M; the output tensor; ``--pure``; ``--tensor-type``
overrides), ``tensor_requires_imatrix`` and ``tensor_type_fallback`` (row lengths that do not fit the block).
Only the branches reachable for the file types offered here are reproduced: the IQ1/IQ2/IQ3/TQ/MXFP4 mixes and the
Falcon, LLaMA-70B and GLM5-next special cases never apply to them.

Shapes are numpy order (``shape[-1]`` is ggml's ``ne[0]``, the row length).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Sequence

from gguf import GGMLQuantizationType

from dflashkit.codecs import QUANT_TYPES
from dflashkit.errors import DFlashError, UsageError
from dflashkit.quant_types import block_size, is_quantized
from dflashkit.filetypes import ALL_FILE_TYPES, FILE_TYPE_ALIASES, QUANTIZE_FILE_TYPES, FileType
from .overrides import (OVERRIDE_TYPES, normalize_overrides, parse_ggml_type, parse_tensor_type_override,  # noqa: F401
                        pattern_hazard)

Q = GGMLQuantizationType

__all__ = [
    "FileType", "FILE_TYPES", "TypeChoice", "choose_types", "get_file_type", "parse_ggml_type",
    "parse_tensor_type_override", "normalize_overrides", "is_quantized", "use_more_bits", "OVERRIDE_TYPES",
    "Preset", "PRESETS", "get_preset",
]


# llama_ftype values and llama_ftype_get_default_type: the one table in dflashkit.filetypes.
FILE_TYPES: dict[str, FileType] = {name: ALL_FILE_TYPES[name] for name in QUANTIZE_FILE_TYPES}

# tensor_type_fallback: a 256-block type whose row length does not fit demotes to a 32-block type (each type's
# module names its own).
_FALLBACK: dict[GGMLQuantizationType, GGMLQuantizationType] = {
    t: qt.fallback for t, qt in QUANT_TYPES.items() if qt.fallback is not None}




@dataclass(frozen=True)
class Preset:
    """A named drafter-aware recipe: a llama.cpp file type plus ``--tensor-type`` overrides, so llama-quantize
    makes the same file (``llama-quantize --tensor-type fc=q8_0 ... IN OUT Q4_K_M``) and llama.cpp loads it."""

    name: str
    file_type: str
    overrides: tuple[str, ...]
    description: str

    def llama_quantize_args(self) -> list[str]:
        return [a for o in self.overrides for a in ("--tensor-type", o)]


#: The field's practice for DFlash drafters (Lucebox's requant script): the drafter's reading of the target (fc)
#: and its attention projections stay Q8_0 under a Q4_K_M body.
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("Q4_K_M_DRAFT", "Q4_K_M", (r"^fc\.weight$=q8_0", r"attn_(q|k|v|output)\.weight=q8_0"),
           "Q4_K_M, with fc and the attention projections (q, k, v, output) at Q8_0"),
)}


def get_preset(name: str) -> Preset | None:
    """The preset called ``name`` (case-insensitive), or None when it names no preset."""
    return PRESETS.get(str(name).strip().upper())


def get_file_type(name: str | FileType) -> FileType:
    """``"q4_k_m"`` -> FILE_TYPES["Q4_K_M"]; an unknown name is a usage error."""
    if isinstance(name, FileType):
        return name
    key = str(name).strip().upper()
    ft = FILE_TYPES.get(FILE_TYPE_ALIASES.get(key, key))
    if ft is None:
        raise UsageError(f"unknown TYPE '{name}' — choose one of {', '.join([*FILE_TYPES, *PRESETS])}")
    return ft


# ------------------------------------------------------------------------------------------ categories
class Category(enum.Enum):
    """tensor_category of llama-quant.cpp (broad roles, matched on substrings of the name)."""

    TOKEN_EMBD = "token_embd"
    ATTENTION_Q = "attn_q"
    ATTENTION_V = "attn_v"
    ATTENTION_K = "attn_k"
    ATTENTION_QKV = "attn_qkv"
    ATTENTION_KV_B = "attn_kv_b"
    ATTENTION_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OUTPUT = "output"
    OTHER = "other"


# tensor_get_category: first match wins, in this order.
_CATEGORY_SUBSTRINGS: tuple[tuple[str, Category], ...] = (
    ("attn_qkv.weight", Category.ATTENTION_QKV),
    ("attn_kv_b.weight", Category.ATTENTION_KV_B),
    ("attn_v.weight", Category.ATTENTION_V),
    ("attn_k.weight", Category.ATTENTION_K),
    ("attn_q.weight", Category.ATTENTION_Q),
    ("attn_output.weight", Category.ATTENTION_OUTPUT),
    ("ffn_up", Category.FFN_UP),
    ("ffn_gate", Category.FFN_GATE),
    ("ffn_down", Category.FFN_DOWN),
)
_ATTN_V_LIKE = (Category.ATTENTION_V, Category.ATTENTION_QKV, Category.ATTENTION_KV_B)  # category_is_attn_v


def tensor_category(name: str) -> Category:
    """tensor_get_category. DFlash's fc / conv_proj / selector_* tensors are OTHER (default type)."""
    if name == "output.weight":
        return Category.OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return Category.TOKEN_EMBD
    for sub, cat in _CATEGORY_SUBSTRINGS:
        if sub in name:
            return cat
    return Category.OTHER


# tensor_allows_quantization: substrings that keep a tensor as it is (the GLM5-next-only list is left out).
_KEEP_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
    ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")  # LLM_TN(arch)(POS_EMBD / TOKEN_TYPES, "weight")


def ggml_n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: trailing ggml dims of size 1 do not count (numpy shape (1, 64) is 1-D)."""
    ne = list(reversed(shape))
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] > 1:
            return i + 1
    return 1


def why_not_quantized(name: str, shape: Sequence[int]) -> str | None:
    """None if tensor_allows_quantization lets llama-quantize change the tensor's type, else why not."""
    if ggml_n_dims(shape) < 2:
        return "1-D tensor"
    # `name.rfind("weight") == name.size() - 6`: a 5-character name passes too (size_t wrap-around)
    if not (name.endswith("weight") or len(name) == 5):
        return "name does not end in 'weight'"
    if "_norm.weight" in name:
        return "norm"
    if name in _KEEP_NAMES or any(s in name for s in _KEEP_SUBSTRINGS):
        return "kept as is by llama.cpp"
    return None


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth, and every third layer in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


_LAYER_RE = re.compile(r"blk\.\s*([+-]?\d+)")


def _layer_of(name: str) -> int | None:
    """sscanf(name, "blk.%d.", &layer)."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def _llama_order_key(name: str) -> tuple[int, str]:
    """llama_model_loader::weight_name_comparer: by layer (non-layer tensors first), then by name."""
    layer = _layer_of(name)
    return (-1 if layer is None else layer, name)


# ------------------------------------------------------------------------------------------ choosing
@dataclass
class TypeChoice:
    """The type one tensor gets. ``fallback`` is the message when tensor_type_fallback changed it
    (``fallback_from``: the type it wanted); ``reason`` says why the type is not the file type's default."""

    name: str
    shape: tuple[int, ...]
    old_type: GGMLQuantizationType
    new_type: GGMLQuantizationType
    fallback: str | None = None
    reason: str | None = None
    fallback_from: GGMLQuantizationType | None = field(default=None, repr=False)


@dataclass
class _State:
    """quantize_state_impl: the counters that place the more-bits layers."""

    n_attention_wv: int
    n_layers: int  # n_ffn_down = n_ffn_gate = n_ffn_up = hparams.n_layer_all
    n_expert: int
    has_tied_embeddings: bool
    n_gqa: int = 0  # hparams.n_gqa(): heads / kv heads of layer 0 (0 without kv heads)
    has_imatrix: bool = False
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0

    def layer_info(self, i_layer: int, name: str) -> tuple[int, int]:
        """layer_info: with experts the layer comes from the name (experts are not consecutive)."""
        if self.n_expert > 1:
            layer = _layer_of(name)
            if layer is None:
                raise DFlashError(f"tensor '{name}': cannot determine its layer (expected blk.N.*)")
            if not 0 <= layer < self.n_layers:
                raise DFlashError(f"tensor '{name}': layer {layer} is outside [0, {self.n_layers}) (block_count)")
            return layer, self.n_layers
        return i_layer, self.n_layers


def _attn_v_type(st: _State, n: str, new_type: Q) -> tuple[Q, str | None]:
    """The attn_v-like branch of llama_tensor_get_type_impl for the file types offered here."""
    i, gqa, of = st.i_attention_wv, st.n_gqa, f"{n}: attn_v #{st.i_attention_wv}"
    rule: tuple[Q, str] | None = None
    if n == "Q2_K":
        rule = (Q.Q4_K, f"{of} gets Q4_K (n_gqa {gqa} >= 4)") if gqa >= 4 else (Q.Q3_K, f"{of} gets Q3_K")
    elif n == "Q2_K_S" and gqa >= 4:
        rule = (Q.Q4_K, f"{of} gets Q4_K (n_gqa {gqa} >= 4)")
    elif n == "Q3_K_M":
        rule = (Q.Q5_K, f"{of} < 2 gets Q5_K") if i < 2 else (Q.Q4_K, f"{of} gets Q4_K")
    elif n == "Q3_K_L":
        rule = (Q.Q5_K, f"{of} gets Q5_K")
    elif n in ("IQ4_NL", "IQ4_XS") and gqa >= 4:
        rule = (Q.Q5_K, f"{of} gets Q5_K (n_gqa {gqa} >= 4)")
    elif n in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, st.n_attention_wv):
        rule = (Q.Q6_K, f"{of} of {st.n_attention_wv} gets more bits (use_more_bits)")
    elif n == "Q4_K_S" and i < 4:
        rule = (Q.Q5_K, f"{of} < 4 gets Q5_K")
    new_type, reason = rule if rule is not None else (new_type, None)
    if st.n_expert == 8:
        new_type, reason = Q.Q8_0, "8-expert model: attn_v Q8_0"
    st.i_attention_wv += 1
    return new_type, reason


def _ffn_down_type(st: _State, n: str, name: str, new_type: Q) -> tuple[Q, str | None]:
    """The ffn_down branch of llama_tensor_get_type_impl (a drafter is never Falcon)."""
    i_layer, n_layer = st.layer_info(st.i_ffn_down, name)
    first_eighth = i_layer < n_layer // 8
    of = f"{n}: ffn_down layer {i_layer}"
    rule: tuple[Q, str] | None = None
    if n == "Q2_K":
        rule = (Q.Q3_K, f"{of} gets Q3_K")
    elif n == "Q2_K_S":
        rule = (Q.Q4_K, f"{of} < {n_layer}/8 gets Q4_K") if first_eighth else None
    elif n == "Q3_K_M":
        rule = (Q.Q5_K, f"{of} < {n_layer}/16 gets Q5_K") if i_layer < n_layer // 16 else (Q.Q4_K, f"{of} gets Q4_K")
    elif n == "Q3_K_L":
        rule = (Q.Q5_K, f"{of} gets Q5_K")
    elif n == "Q4_K_M":
        rule = (Q.Q6_K, f"{of} of {n_layer} gets more bits (use_more_bits)") if use_more_bits(i_layer, n_layer) \
            else None
    elif first_eighth and n in ("IQ4_NL", "IQ4_XS") and not st.has_imatrix:
        rule = (Q.Q5_K, f"{of} < {n_layer}/8 gets Q5_K (no importance matrix)")
    elif n == "Q5_K_M" and use_more_bits(i_layer, n_layer):
        rule = (Q.Q6_K, f"{of} of {n_layer} gets more bits (use_more_bits)")
    elif n == "Q4_K_S" and first_eighth:
        rule = (Q.Q5_K, f"{of} < {n_layer}/8 gets Q5_K")
    elif n in ("Q4_0", "Q5_0") and st.has_imatrix and first_eighth:
        # llama.cpp: "guard against craziness in the first few ffn_down layers" — with an imatrix only
        to = Q.Q4_1 if n == "Q4_0" else Q.Q5_1
        rule = (to, f"{of} < {n_layer}/8 gets {to.name} (with an importance matrix)")
    st.i_ffn_down += 1
    return rule if rule is not None else (new_type, None)


#: attn_output of a model that is not 8-expert: file type -> type (llama_tensor_get_type_impl)
_ATTN_OUTPUT = {"Q2_K": Q.Q3_K, "Q3_K_M": Q.Q4_K, "Q3_K_L": Q.Q5_K}
#: attn_output of an 8-expert model: these file types get Q5_K
_ATTN_OUTPUT_8X = frozenset({"Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS"})


def _mix_type(st: _State, name: str, shape: Sequence[int], new_type: Q, ft: FileType,
              cat: Category) -> tuple[Q, str | None]:
    """llama_tensor_get_type_impl for the file types in FILE_TYPES (type, reason when it changed)."""
    ne0 = shape[-1]
    n = ft.name
    if cat is Category.OUTPUT or (st.has_tied_embeddings and cat is Category.TOKEN_EMBD):
        role = "output tensor" if cat is Category.OUTPUT else "token_embd (tied to the output)"
        if ne0 % block_size(new_type):
            return Q.Q8_0, f"{role} with row length {ne0} not a multiple of {block_size(new_type)}: Q8_0"
        if new_type != Q.Q8_0:
            return Q.Q6_K, f"{role}: Q6_K"
        return new_type, None
    if cat is Category.TOKEN_EMBD:
        return new_type, None  # untied embeddings: no rule for these file types
    if cat in _ATTN_V_LIKE:  # (the ATTENTION_QKV branch after this one is unreachable in llama.cpp too)
        return _attn_v_type(st, n, new_type)
    if cat is Category.ATTENTION_K:
        if st.n_expert == 8:
            return Q.Q8_0, "8-expert model: attn_k Q8_0"
        return new_type, None
    if cat is Category.FFN_DOWN:
        return _ffn_down_type(st, n, name, new_type)
    if cat is Category.ATTENTION_OUTPUT:
        if st.n_expert == 8:
            return (Q.Q5_K, "8-expert model: attn_output Q5_K") if n in _ATTN_OUTPUT_8X else (new_type, None)
        if n in _ATTN_OUTPUT:
            return _ATTN_OUTPUT[n], f"{n}: attn_output {_ATTN_OUTPUT[n].name}"
        return new_type, None
    if cat is Category.FFN_GATE:  # no rule for these file types; layer_info still validates the name
        st.layer_info(st.i_ffn_gate, name)
        st.i_ffn_gate += 1
    elif cat is Category.FFN_UP:
        st.layer_info(st.i_ffn_up, name)
        st.i_ffn_up += 1
    return new_type, None


def _fallback(name: str, ne0: int, target: Q, allow: bool) -> tuple[Q, str | None]:
    """tensor_type_fallback: Q4_K->Q5_0, Q5_K->Q5_1, Q6_K->Q8_0, then F16 if 32 does not divide the row."""
    qk = block_size(target)
    if ne0 % qk == 0:
        return target, None
    ret = _FALLBACK.get(target)
    if ret is None:
        if qk > 32:
            raise DFlashError(f"tensor '{name}': row length {ne0} does not fit {target.name} and llama.cpp defines "
                              "no fallback for it — pick another type with --tensor-type")
        ret = target  # already a 32-block type: the check below makes it F16
    if ne0 % block_size(ret):
        ret = Q.F16
    msg = f"row length {ne0} is not a multiple of {qk} ({target.name}): {ret.name} instead"
    if not allow:
        raise DFlashError(f"tensor '{name}': row length {ne0} is not a multiple of {qk} as {target.name} needs "
                          f"(llama-quantize would fall back to {ret.name}) — drop --no-fallback to accept that, "
                          f"or choose its type with --tensor-type")
    return ret, msg


def choose_types(
    tensors: Sequence[tuple[str, tuple[int, ...], GGMLQuantizationType]],
    file_type: str | FileType,
    *,
    n_layers: int,
    pure: bool = False,
    overrides: Sequence[tuple[re.Pattern[str], GGMLQuantizationType]] = (),
    allow_fallback: bool = True,
    n_expert: int = 0,
    n_gqa: int = 0,
    has_imatrix: bool = False,
) -> list[TypeChoice]:
    """The type llama-quantize gives every tensor (llama_tensor_get_type), in the order given.

    ``tensors``: (GGUF name, numpy-order shape, current type) in file order. ``n_layers`` is the model's
    block_count (llama.cpp's n_ffn_down), ``n_expert`` its expert_count. Counters advance in llama.cpp's
    tensor order (by layer, then name), whatever the file order is. With ``allow_fallback=False`` the first
    fallback raises DFlashError naming the tensor, its row length and the type. ``n_gqa`` (heads per kv head)
    and ``has_imatrix`` select the branches of the mixes that depend on them (Q2_K, IQ4_*, Q4_0 / Q5_0).
    """
    ft = get_file_type(file_type)
    default = ft.default_type
    cats = {name: tensor_category(name) for name, _, _ in tensors}
    # init_quantize_state_counters: attn_v-like tensors are counted over all tensors, by name
    st = _State(
        n_attention_wv=sum(c in _ATTN_V_LIKE for c in cats.values()),
        n_layers=n_layers,
        n_expert=n_expert,
        has_tied_embeddings=Category.OUTPUT not in cats.values(),
        n_gqa=n_gqa,
        has_imatrix=has_imatrix,
    )
    choices: dict[str, TypeChoice] = {}
    for name, shape, old in sorted(tensors, key=lambda t: _llama_order_key(t[0])):
        shape = tuple(int(d) for d in shape)
        choice = TypeChoice(name, shape, old, old)
        choices[name] = choice
        kept = why_not_quantized(name, shape)
        if kept is not None:
            choice.reason = f"kept: {kept}"
            continue
        new_type, reason = default, None
        if ft.quantized:  # llama.cpp applies overrides, the mix and fallbacks only for quantized defaults
            manual = False
            for pattern, qtype in overrides:
                if pattern.search(name):
                    new_type, reason, manual = qtype, f"--tensor-type {pattern.pattern}={qtype.name}", True
                    break
            if not manual and not pure:
                new_type, reason = _mix_type(st, name, shape, new_type, ft, cats[name])
            wanted = new_type
            new_type, choice.fallback = _fallback(name, shape[-1], new_type, allow_fallback)
            if choice.fallback:
                choice.fallback_from = wanted
        choice.new_type, choice.reason = new_type, reason
    return [choices[name] for name, _, _ in tensors]
