"""The token list of an HF byte-level BPE tokenizer as llama.cpp's ``get_vocab_base`` builds it: every id below the
config's ``vocab_size`` (``[PAD{id}]`` where none is defined), each token's type (NORMAL, CONTROL, USER_DEFINED,
UNUSED), and the tokens transformers adds on load from tokenizer_config.json.

Also the tokenizer's JSON files read once each (`_ParsedJson`) and the refusal of anything but byte-level BPE
(sentencepiece-style vocabularies come from the target's GGUF instead).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf import TokenType

from dflashkit.errors import DFlashError
from dflashkit.files import read_json, side_file

# Special-token kinds SpecialVocab looks for (its default special_token_types).
_SPECIAL_TYPES: tuple[str, ...] = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


class _ParsedJson:
    """The tokenizer's JSON files, each parsed at most once per conversion (callers do not mutate them)."""

    def __init__(self) -> None:
        self._parsed: dict[Path, Any] = {}

    def read(self, path: Path) -> Any:
        if path not in self._parsed:
            self._parsed[path] = read_json(path, hint="; re-download the file")
        return self._parsed[path]

    def read_if_present(self, path: Path) -> dict[str, Any] | None:
        if not side_file(path):
            return None
        data = self.read(path)
        if not isinstance(data, dict):
            raise DFlashError(f"{path}: expected a JSON object; re-download the file")
        return data


def _require_byte_level_bpe(tok: Any, path: Path) -> None:
    model = tok.get("model") if isinstance(tok, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("vocab"), dict):
        raise DFlashError(f"{path}: no model.vocab object; re-download tokenizer.json")
    kind = model.get("type")
    # byte_fallback BPE (Llama 2, Gemma, Mistral) is sentencepiece-style: llama.cpp writes it as a
    # "llama"/"gemma4" vocab with scores, not as gpt2. Only byte-level BPE is rebuilt here.
    byte_level = "ByteLevel" in json.dumps([tok.get("pre_tokenizer"), tok.get("decoder")])
    if kind != "BPE" or model.get("byte_fallback") or not byte_level:
        what = "byte-fallback BPE" if kind == "BPE" and model.get("byte_fallback") else f"{kind or 'unknown'} model"
        raise DFlashError(
            f"{path}: {what} is not a byte-level BPE (gpt2-style) tokenizer, the only kind rebuilt "
            f"from an HF directory; pass the target's GGUF file as --target instead"
        )


def does_token_look_special(token: str) -> bool:
    """llama.cpp's heuristic for added tokens that should be CONTROL though not marked special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))  # deepseek's fullwidth bars
        or (token.startswith("<unused") and token.endswith(">"))
    )


def _add_config_tokens(backend: Any, tokenizer_config: dict[str, Any] | None) -> None:
    """Add what transformers' fast tokenizer adds on load, so ids and types match llama.cpp's
    AutoTokenizer: tokenizer_config's added_tokens_decoder entries missing from tokenizer.json,
    then the special tokens it names (eos_token, ...) that are not added tokens yet."""
    if not tokenizer_config:
        return
    from tokenizers import AddedToken

    known = {token.content for token in backend.get_added_tokens_decoder().values()}
    to_add: list[Any] = []
    named = [tokenizer_config.get(f"{typ}_token") for typ in _SPECIAL_TYPES]
    named += list(tokenizer_config.get("additional_special_tokens") or [])
    named_contents = {c for c in map(_content, named) if c is not None}
    decoder = tokenizer_config.get("added_tokens_decoder") or {}
    for _, item in sorted(decoder.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else -1):
        content = _content(item)
        if content is None or content in known:
            continue
        special = bool(item.get("special", False)) or content in named_contents
        to_add.append(AddedToken(
            content,
            special=special,
            normalized=bool(item.get("normalized", not special)),
            lstrip=bool(item.get("lstrip", False)),
            rstrip=bool(item.get("rstrip", False)),
            single_word=bool(item.get("single_word", False)),
        ))
        known.add(content)
    for entry in named:
        content = _content(entry)
        if content is not None and content not in known:
            to_add.append(AddedToken(content, special=True, normalized=False))
            known.add(content)
    if to_add:
        backend.add_tokens(to_add)  # tokenizers assigns the ids, as it does for transformers


def _token_list(
    vocab: dict[str, int], added: dict[int, Any], vocab_size: int, backend: Any
) -> tuple[list[str], list[int]]:
    """llama.cpp's get_vocab_base: ids 0..vocab_size-1, [PAD{id}] where none is defined."""
    reverse = {token_id: content for content, token_id in vocab.items()}
    added_contents = {token.content for token in added.values()}
    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        token = reverse.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            toktypes.append(int(TokenType.UNUSED))
            continue
        if token in added_contents:
            info = added.get(i)
            if info is not None and not info.normalized:
                # llama.cpp expects CONTROL/USER_DEFINED text pre-normalized: round-trip it.
                token = backend.decode(backend.encode(token, add_special_tokens=False).ids, skip_special_tokens=False)
            if (info is not None and info.special) or does_token_look_special(token):
                toktypes.append(int(TokenType.CONTROL))
            else:
                token = token.replace("\u2581", " ")  # pre-normalize sentencepiece-style spaces
                toktypes.append(int(TokenType.USER_DEFINED))
        else:
            toktypes.append(int(TokenType.NORMAL))
        tokens.append(token)
    return tokens, toktypes


def _content(entry: Any) -> str | None:
    """A special-token entry of tokenizer_config: a string or a serialized AddedToken."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None
