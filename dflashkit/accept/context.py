"""Long context before each prompt (``--context N``): the same bytes for every drafter, runtime and build.

Where the context comes from, in this order:

* ``--context-file FILE``: UTF-8 text of the target's own domain (long documents, a book, a code base flattened).
  Prompt *i* of *P* reads N tokens of it starting at token ``i · (M − N) // P`` (M: the tokens of the file's
  opening that is encoded — as far as the longest level needs for every prompt a stretch of its own, and at least its
  first MiB: `encode_window`), so the prompts see different stretches when the file is long enough and the same
  opening when it is just long enough;
* otherwise the prompts themselves: prompt *i* reads the *other* prompts' texts (message contents for chat
  prompts), from prompt *i + 1* on, wrapping, never its own — as a long conversation or a pile of documents would
  precede it. Where the others hold fewer than N tokens the run is refused (give ``--context-file``): repeating
  them would measure copying, not long context.

The N tokens are the target tokenizer's: the source is encoded, cut to N ids and decoded back to text, then put
before the prompt — a raw-text prompt becomes ``context + " " + text`` (a continuation of the same document), a
chat prompt's first user message ``context + "\\n\\n" + content``. Re-encoding the joined text gives N + the
prompt's tokens, give or take a merge at the seam: every figure states the *measured* mean prompt tokens.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from ..errors import DFlashError, UsageError
from ..files import read_bounded
from ..sweeps import level_label
from .prompts import Prompt

#: the most prompt tokens a run keeps (as Python lists, ~36 bytes a token: 8 M tokens ≈ 300 MB with their texts)
MAX_PROMPT_TOKENS_TOTAL = 8_000_000
#: a context file larger than this is refused (64 MiB of text ≈ 16 M tokens: past every level)
MAX_CONTEXT_FILE_BYTES = 64 << 20
#: the characters one tokenizer call encodes: a fast tokenizer's encoding of a whole 16 MB file holds every token's
#: string and offsets (2.6 GB); chunks of this size, cut at a line start, keep it to tens of MB. A text of at most this
#: many characters is encoded in one call, as it always was.
ENCODE_CHUNK_CHARS = 1 << 18  # (a character can be ~4 tokens: an emoji in a byte-level BPE)
#: the least of a context file a run encodes (then on, chunk by chunk, only until the levels have their tokens)
MIN_WINDOW_CHARS = 1 << 20
RAW_SEPARATOR = " "
CHAT_SEPARATOR = "\n\n"


def read_context_file(path: str | os.PathLike) -> str:
    """The text of ``--context-file``, read bounded (a FIFO or /dev/zero is not read until memory runs out)."""
    src = Path(path)
    try:
        if src.is_dir():
            raise DFlashError(f"{src}: is a directory, not a context file (UTF-8 text)")
        raw = read_bounded(src, MAX_CONTEXT_FILE_BYTES)
    except FileNotFoundError:
        raise DFlashError(f"{src}: no such context file") from None
    except OSError as exc:
        raise DFlashError(f"{src}: cannot read the context file ({exc.strerror or exc})") from None
    if len(raw) > MAX_CONTEXT_FILE_BYTES:
        raise DFlashError(f"{src}: the context file is over {MAX_CONTEXT_FILE_BYTES >> 20} MiB — give a smaller one")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DFlashError(f"{src}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}) — save the "
                          "context file as UTF-8") from None
    if not text.strip():
        raise DFlashError(f"{src}: the context file is empty — give long text of the target's domain")
    if "\x00" in text:
        raise DFlashError(f"{src}: the context file holds a NUL byte (offset {text.index(chr(0))}) — llama.cpp cuts "
                          "a prompt there; give plain text")
    return text


def _chunk_end(text: str, start: int, size: int) -> int:
    """Where a chunk of ``text`` from ``start`` ends: after the last line break within ``size`` characters that a
    non-space follows (a pre-tokenizer boundary of the byte-level BPEs in circulation: a token never spans it), else
    before the last space that follows a non-space, else at ``size`` characters."""
    end = start + size
    if end >= len(text):
        return len(text)
    cut = text.rfind("\n", start, end)
    while cut > start and text[cut + 1].isspace():
        cut = text.rfind("\n", start, cut)
    if cut > start:
        return cut + 1
    cut = text.rfind(" ", start, end)
    while cut > start and text[cut - 1].isspace():
        cut = text.rfind(" ", start, cut - 1)
    return cut if cut > start else end


def encode_window(tokenizer: Any, text: str, tokens: int, *, min_chars: int = MIN_WINDOW_CHARS) -> array:
    """The ids of ``text``'s opening, encoded chunk by chunk (`ENCODE_CHUNK_CHARS`, cut at a line start) until they
    number at least ``tokens`` and at least ``min_chars`` characters are read (or the text ends): int32, 4 bytes a
    token, never the whole of a long file's encoding at once."""
    ids = array("i")
    start = 0
    while start < len(text) and (len(ids) < tokens or start < min_chars):
        end = _chunk_end(text, start, ENCODE_CHUNK_CHARS)
        ids.extend(tokenizer.encode(text[start:end], add_special_tokens=False))
        start = end
    return ids


def _content(prompt: Prompt) -> str:
    if prompt.messages is not None:
        return CHAT_SEPARATOR.join(c for _, c in prompt.messages)
    return prompt.text or ""


class LongContext:
    """Builds the context of every prompt at every level from one source, with ``tokenizer`` (the target's: an
    ``encode(text, add_special_tokens=False)`` / ``decode(ids)`` object)."""

    def __init__(self, tokenizer: Any, prompts: Sequence[Prompt], file_text: str | None = None,
                 file_name: str | None = None, levels: Sequence[int] = ()) -> None:
        self.tokenizer, self.prompts = tokenizer, list(prompts)
        self.file_name = file_name
        self._file_ids: array | None = None
        self._file_text = file_text
        # a file is encoded as far as the longest level needs for every prompt its own stretch (and at least its
        # opening MiB), not whole: memory and time follow what is measured, not the file's size
        self._window_tokens = max(levels, default=0) * max(1, len(self.prompts))
        self._prompt_ids: dict[int, list[int]] = {}

    @property
    def source(self) -> str:
        if self._file_text is not None:
            return f"context file {self.file_name or '(given)'}"
        return "the other prompts of the set, never a prompt's own"

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def context_ids(self, index: int, tokens: int) -> list[int]:
        """The ``tokens`` ids of long context prompt ``index`` reads."""
        if tokens == 0:
            return []
        if self._file_text is not None:
            if self._file_ids is None:
                self._file_ids = encode_window(self.tokenizer, self._file_text, max(tokens, self._window_tokens))
            ids = self._file_ids
            if len(ids) < tokens:
                raise DFlashError(f"--context {level_label(tokens)}: {self.source} holds {len(ids):,} tokens of the "
                                  "target's tokenizer — give a longer file or a shorter level")
            start = index * (len(ids) - tokens) // max(1, len(self.prompts))
            return ids[start: start + tokens].tolist()
        texts: list[str] = []
        counted, n = 0, len(self.prompts)
        for step in range(1, n):
            other = (index + step) % n
            if other not in self._prompt_ids:  # a length estimate; the joined text is encoded as one below
                self._prompt_ids[other] = self._encode(_content(self.prompts[other]) + RAW_SEPARATOR)
            texts.append(_content(self.prompts[other]))
            counted += len(self._prompt_ids[other])
            if counted >= tokens:
                ids = self._encode(RAW_SEPARATOR.join(texts))
                if len(ids) >= tokens:
                    return ids[:tokens]
        raise DFlashError(f"--context {level_label(tokens)}: the other prompts hold only {counted:,} tokens of context "
                          f"for prompt {self.prompts[index].id} — give --context-file FILE (long text of the target's "
                          "domain)")

    def prompts_at(self, tokens: int) -> list[Prompt]:
        """Every prompt with ``tokens`` tokens of long context before it (the prompts as they are at 0)."""
        if tokens == 0:
            return list(self.prompts)
        out = []
        for i, p in enumerate(self.prompts):
            context = self.tokenizer.decode(self.context_ids(i, tokens))
            if p.messages is None:
                out.append(replace(p, text=context + RAW_SEPARATOR + (p.text or "")))
            else:
                first = next((k for k, (role, _) in enumerate(p.messages) if role == "user"), 0)
                messages = list(p.messages)
                role, content = messages[first]
                messages[first] = (role, context + CHAT_SEPARATOR + content)
                out.append(replace(p, messages=tuple(messages)))
        return out


def target_context(runner: Any) -> int | None:
    """The target's context length (``max_position_embeddings`` of its text config), where its config gives one."""
    config = getattr(getattr(runner, "model", None), "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_levels_fit(levels: Sequence[int], context: int | None, longest_prompt: int, max_new_tokens: int,
                     where: str) -> None:
    """Every level + the longest prompt + the new tokens inside ``context`` (the target's), before any round."""
    if context is None or not levels:
        return
    top = max(levels)
    if top + longest_prompt + max_new_tokens > context:
        raise UsageError(f"--context {level_label(top)}: {top:,} + {longest_prompt} prompt tokens + {max_new_tokens} new "
                         f"tokens exceed {where}'s context of {context:,} (max_position_embeddings) — give levels up to "
                         f"{max(0, context - longest_prompt - max_new_tokens):,}")
