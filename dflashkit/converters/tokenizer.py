"""Tokenizer metadata (``tokenizer.*`` GGUF keys) for drafter GGUFs, taken from the target model.

llama.cpp refuses a drafter GGUF without a tokenizer ("key not found in model:
tokenizer.ggml.model"); drafters have none of their own, so it comes from the target. The output
is what llama.cpp's own converter (``convert_hf_to_gguf.py``, llama-cpp-python 0.3.36's vendored
llama.cpp) writes for the same target: same keys, order, value types and bytes.

What gguf-py does, gguf-py does here: key names are ``gguf.Keys.Tokenizer``; the ``tokenizer.*``
keys from an HF directory are produced by gguf-py's own ``GGUFWriter.add_*`` methods (recorded,
never written to disk) and ``gguf.SpecialVocab`` (merges, special token ids, add_bos/add_eos/
add_sep flags, chat templates), as llama.cpp's ``_set_vocab_gpt2`` calls them.

What is written by hand, and why:

* the copy from a target GGUF (here): every ``tokenizer.*`` KV verbatim (key, type, element type, value,
  order) from the header alone, through the project's hardened reader; gguf-py's ``GGUFReader``
  maps the whole file, tensor data included, and has no verbatim-copy helper;
* llama.cpp's ``get_vocab_base`` / ``get_vocab_base_pre`` (they live in the converter, not in
  gguf-py): the token list with ``[PAD{id}]`` (UNUSED) for every id below the target config's
  ``vocab_size`` the tokenizer lacks, the token types (`hf_vocab`), and the pre-tokenizer hash table
  (`pre_tokenizer`);
* :class:`_ConverterSpecialVocab` (`special_vocab`): llama.cpp's converter runs the gguf-py *vendored in its source
  tree*, whose ``SpecialVocab`` is newer than the released ``gguf`` package (0.19.0 on PyPI, same
  version number). The vendored one (i) reads a ``ByteLevel`` post-processor as "no BOS/EOS
  added" (so Qwen-style targets get ``add_bos_token`` *and* ``add_eos_token`` false), (ii) lets the
  post-processor win over ``tokenizer_config.json``'s ``add_*_token``, (iii) takes a
  ``TemplateProcessing`` leading special token as BOS/CLS when the config names none, and (iv)
  writes ``tokenizer.ggml.normalizer.lowercase`` / ``.strip_accents``. The subclass runs the
  released ``SpecialVocab`` and applies exactly these four differences on top, so the output
  follows llama.cpp's converter (checked against it in tests/test_target_tokenizer.py).

Neither path loads model weights: an HF directory is read through its JSON files only (never
``trust_remote_code``, never a pickle), a GGUF through its header only.

This module assembles the keys (`tokenizer_from_gguf`, `tokenizer_from_hf_dir`, `TokenizerMetadata`) and
re-exports what the modules above define, so every name stays importable from here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import gguf
from gguf import GGUFValueType, Keys

from dflashkit import bounds
from dflashkit.converters.hf_vocab import (
    _ParsedJson,
    _add_config_tokens,
    _require_byte_level_bpe,
    _token_list,
    does_token_look_special,
)
from dflashkit.converters.pre_tokenizer import (
    _CHKTXT,
    LLAMA_CPP_PRE_HASHES,
    PRE_TOKENIZER_REGEXES,
    load_backend,
    pre_tokenizer_hash,
    pre_tokenizer_name,
)
from dflashkit.converters.special_vocab import (
    KEY_NORMALIZER_LOWERCASE,
    KEY_NORMALIZER_STRIP_ACCENTS,
    _ConverterSpecialVocab,
)
from dflashkit.errors import DFlashError
from dflashkit.files import side_file
from dflashkit.io.gguf_writer import MetadataEntry

if TYPE_CHECKING:
    from gguf import GGUFWriter

    from dflashkit.io.gguf_reader import GGUFFile

__all__ = [
    "KEY_MERGES",
    "KEY_MODEL",
    "KEY_NORMALIZER_LOWERCASE",
    "KEY_NORMALIZER_STRIP_ACCENTS",
    "KEY_TOKENS",
    "LLAMA_CPP_PRE_HASHES",
    "PRE_TOKENIZER_REGEXES",
    "TOKENIZER_PREFIX",
    "TokenizerMetadata",
    "_CHKTXT",  # llama.cpp's check text (tests compare its hash with llama.cpp's)
    "does_token_look_special",
    "load_backend",
    "pre_tokenizer_hash",
    "pre_tokenizer_name",
    "tokenizer_from_gguf",
    "tokenizer_from_hf_dir",
]

TOKENIZER_PREFIX = "tokenizer."
KEY_MODEL = Keys.Tokenizer.MODEL
KEY_TOKENS = Keys.Tokenizer.LIST
KEY_MERGES = Keys.Tokenizer.MERGES


@dataclass
class TokenizerMetadata:
    """Every ``tokenizer.*`` key of a model, in the order to write them."""

    entries: list[MetadataEntry]
    source: str  # e.g. "target GGUF Qwen3-8B.gguf" / "target HF dir ./Qwen3-8B"
    vocab_size: int  # len(tokenizer.ggml.tokens)

    def get(self, key: str, default: Any = None) -> Any:
        for entry in self.entries:
            if entry.key == key:
                return entry.value
        return default

    @property
    def tokens(self) -> list[Any]:
        return list(self.get(KEY_TOKENS) or [])

    @property
    def merges(self) -> list[Any]:
        return list(self.get(KEY_MERGES) or [])

    def tokens_hash(self) -> str:
        """sha256 of the token list (Inspect compares drafter and target tokenizers with it)."""
        return _hash_strings(self.tokens)

    def merges_hash(self) -> str:
        """sha256 of the merges list (of an empty list when there are none)."""
        return _hash_strings(self.merges)

    def write_to(self, writer: GGUFWriter) -> None:
        """Add every entry to a gguf.GGUFWriter with its exact type and element type."""
        for entry in self.entries:
            writer.add_key_value(entry.key, entry.value, entry.type, entry.sub_type)


def _hash_strings(items: Iterable[str | bytes]) -> str:
    # Length-prefixed so that no two different lists hash alike (a token may contain any byte).
    import hashlib  # here: only a --target tokenizer is hashed (4 ms of start-up otherwise)

    digest = hashlib.sha256()
    for item in items:
        raw = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        digest.update(struct.pack("<Q", len(raw)))
        digest.update(raw)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# From a GGUF


def tokenizer_from_gguf(gguf: GGUFFile) -> TokenizerMetadata | None:
    """Copy every ``tokenizer.*`` KV of an open GGUF verbatim; None when it has none."""
    entries = [
        MetadataEntry(kv.key, kv.value, kv.type, kv.sub_type)
        for kv in gguf.kvs.values()
        if kv.key.startswith(TOKENIZER_PREFIX)
    ]
    if not entries:
        return None
    path = Path(str(gguf.path))
    by_key = {entry.key: entry for entry in entries}
    model = by_key.get(KEY_MODEL)
    if model is None:
        # llama.cpp would refuse a drafter carrying these keys: say so now, not at load time.
        raise DFlashError(
            f"{path}: has tokenizer.* keys but no {KEY_MODEL}; llama.cpp cannot load a tokenizer "
            f"from it; pass the target's HF directory as --target instead"
        )
    tokens = by_key.get(KEY_TOKENS)
    if tokens is not None and (
        tokens.type is not GGUFValueType.ARRAY or tokens.sub_type is not GGUFValueType.STRING
    ):
        raise DFlashError(
            f"{path}: {KEY_TOKENS} is not an array of strings; the file is damaged, "
            f"re-convert the target or pass its HF directory as --target"
        )
    if tokens is None and model.value != "none":
        raise DFlashError(
            f"{path}: {KEY_MODEL} is {model.value!r} but {KEY_TOKENS} is missing; "
            f"pass the target's HF directory as --target instead"
        )
    return TokenizerMetadata(
        entries=entries,
        source=f"target GGUF {path.name}",
        vocab_size=len(tokens.value) if tokens is not None else 0,
    )


# --------------------------------------------------------------------------------------------
# From an HF directory (byte-level BPE only)


def tokenizer_from_hf_dir(directory: str | Path, vocab_size: int) -> TokenizerMetadata:
    """Build the tokenizer keys from an HF model directory as llama.cpp's converter would.

    ``vocab_size`` is the target config's: ``tokenizer.ggml.tokens`` lists every id below it,
    ``[PAD{id}]`` (UNUSED) where the tokenizer defines none. Reads tokenizer and config files only.
    """
    directory = Path(directory)
    tokenizer_json = directory / "tokenizer.json"
    if side_file(directory / "tokenizer.model"):
        # llama.cpp converts these with sentencepiece (scores, byte tokens, "llama" model): we do not
        # rebuild that; the target's own GGUF already carries the right keys.
        raise DFlashError(
            f"{directory}: sentencepiece tokenizer (tokenizer.model) cannot be converted from an HF "
            f"directory; pass the target's GGUF file as --target instead"
        )
    if not side_file(tokenizer_json):
        raise DFlashError(
            f"{directory}: no tokenizer files (tokenizer.json); pass the target's GGUF file "
            f"or a complete HF directory as --target"
        )
    files = _ParsedJson()  # each file parsed once (tokenizer.json is ~11 MB for a 152 k vocabulary)
    tok = files.read(tokenizer_json)
    _require_byte_level_bpe(tok, tokenizer_json)
    tokenizer_config = files.read_if_present(directory / "tokenizer_config.json")
    files.read_if_present(directory / "config.json")  # a one-line error now, not SpecialVocab's traceback

    backend = load_backend(tokenizer_json)
    _add_config_tokens(backend, tokenizer_config)
    pre = pre_tokenizer_name(backend, tokenizer_json, tok)
    vocab = backend.get_vocab(with_added_tokens=True)
    if vocab and max(vocab.values()) >= vocab_size:
        worst = max(vocab, key=vocab.__getitem__)
        raise DFlashError(
            f"{tokenizer_json}: token {worst!r} has id {vocab[worst]}, but the config's vocab_size "
            f"is {vocab_size}; the tokenizer does not belong to this model"
        )
    padding = vocab_size - (max(vocab.values()) + 1 if vocab else 0)
    if padding > bounds.MAX_VOCAB_PADDING:  # [PAD{id}] strings are built per id: bounded before building them
        raise DFlashError(
            f"{directory / 'config.json'}: 'vocab_size' is {vocab_size} but the tokenizer defines ids up to "
            f"{vocab_size - padding - 1}; padding {padding} ids is more than {bounds.MAX_VOCAB_PADDING} — fix vocab_size"
        )
    tokens, toktypes = _token_list(vocab, backend.get_added_tokens_decoder(), vocab_size, backend)

    # llama.cpp's _set_vocab_gpt2, through gguf-py's writer methods (recorded, not written).
    writer = gguf.GGUFWriter(None, "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(toktypes)
    try:
        special = _ConverterSpecialVocab(directory, files, load_merges=True)
    except ValueError as exc:  # SpecialVocab's word for a negative special id or unknown merges format
        raise DFlashError(f"{directory}: {exc}; fix tokenizer.json / tokenizer_config.json / config.json") from exc
    special.add_to_gguf(writer, quiet=True)
    entries = _recorded_entries(writer)
    return TokenizerMetadata(entries=entries, source=f"target HF dir {directory}", vocab_size=len(tokens))


def _recorded_entries(writer: GGUFWriter) -> list[MetadataEntry]:
    """The ``tokenizer.*`` KVs a GGUFWriter holds, with element types as it would write them."""
    entries: list[MetadataEntry] = []
    for key, kv in writer.kv_data[0].items():
        if not key.startswith(TOKENIZER_PREFIX):
            continue
        value, sub_type = kv.value, kv.sub_type
        if kv.type is GGUFValueType.ARRAY and sub_type is None:
            sub_type = GGUFValueType.get_type(value[0])  # what GGUFWriter does when serialising
            value = [int(v) for v in value] if sub_type is GGUFValueType.INT32 else list(value)
        entries.append(MetadataEntry(key, value, kv.type, sub_type))
    return _chat_template_names_in_order(entries)


def _chat_template_names_in_order(entries: list[MetadataEntry]) -> list[MetadataEntry]:
    # gguf-py lists named chat templates from a set, so llama.cpp's order changes from run to run;
    # write them in the order they came (one of the orders llama.cpp writes), for a stable file.
    names = [e.key[len(Keys.Tokenizer.CHAT_TEMPLATE) + 1 :] for e in entries if e.key.startswith(Keys.Tokenizer.CHAT_TEMPLATE + ".")]
    return [
        MetadataEntry(e.key, names, e.type, e.sub_type) if e.key == Keys.Tokenizer.CHAT_TEMPLATES else e
        for e in entries
    ]


def llama_add_space_prefix(directory: str | Path) -> list[MetadataEntry]:
    """``tokenizer.ggml.add_space_prefix`` as llama.cpp's ``LlamaModel.set_vocab`` writes it before the vocabulary
    (from ``tokenizer_config.json``'s ``add_prefix_space``, when set) — the vocabulary of a family whose converter
    reads the target through Llama's class (EAGLE-3), whatever the target's own architecture."""
    path = Path(directory) / "tokenizer_config.json"
    if not side_file(path):
        return []
    from dflashkit.files import read_json

    config = read_json(path, hint="; re-download the file")
    value = config.get("add_prefix_space") if isinstance(config, dict) else None
    if value is None:
        return []
    if not isinstance(value, bool):
        raise DFlashError(f"{path}: 'add_prefix_space' must be true or false, got {bounds.quote(value)}")
    return [MetadataEntry(Keys.Tokenizer.ADD_PREFIX, value, GGUFValueType.BOOL)]
