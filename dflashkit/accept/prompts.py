"""The prompts of ``dflash-accept``: a JSONL file (chat ``messages`` or raw text) or the built-in set, and the chat
template's switches (``--reasoning``, ``--chat-template-kwargs``).

A prompts file is read bounded (`MAX_PROMPTS_FILE_BYTES`, `MAX_PROMPT_LINE_BYTES`: a FIFO or ``/dev/zero`` is
not read until memory runs out) and split on ``\n`` only (JSON strings may hold U+2028 or U+0085, which
``str.splitlines`` would split on); prompt ids are unique.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from ..errors import DFlashError, UsageError
from ..files import read_bounded
from ..runtime import HFTarget
from ..templates import render_bounded

#: a prompts file larger than this is refused (both runtimes read the same file)
MAX_PROMPTS_FILE_BYTES = 64 << 20
#: one prompt line larger than this is refused (~250 k tokens: beyond any target's context)
MAX_PROMPT_LINE_BYTES = 1 << 20
#: apply_chat_template's own arguments: a template variable of these names would clash with the call
RESERVED_TEMPLATE_KWARGS = ("messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                            "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                            "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")


@dataclass(frozen=True)
class Prompt:
    """One prompt: chat ``messages`` (rendered with the target's chat template) or raw ``text``."""

    id: str
    category: str = ""
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)
    text: str | None = None

    def ids(self, target: HFTarget, template_kwargs: Mapping[str, Any] | None = None) -> tuple[list[int], bool]:
        """Token ids for ``target``, and whether a chat prompt had to go in as plain text (no template).

        ``template_kwargs`` go to ``apply_chat_template`` (``enable_thinking``, ``reasoning_effort``, ...).
        """
        tok = target.tokenizer
        text, templated, fallback = self.rendered(target, template_kwargs)
        if templated:
            return list(tok.encode(text, add_special_tokens=False)), False
        return list(tok.encode(text)), fallback  # the tokenizer's own specials (a BOS where used)

    def rendered(self, target: HFTarget, template_kwargs: Mapping[str, Any] | None = None) -> tuple[str, bool, bool]:
        """(the prompt as the text the target reads, whether the chat template made it, whether a chat prompt
        fell back to plain text). llama.cpp gets this text (its special tokens are parsed there too)."""
        tok = target.tokenizer
        if self.messages is None:
            return self.text or "", False, False
        if getattr(tok, "chat_template", None):
            chat = [{"role": r, "content": c} for r, c in self.messages]
            text = render_bounded(lambda: tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                                                  **(template_kwargs or {})),
                                  f"prompt {self.id}: the chat template of {target.path}")
            return text, True, False
        # A base model: the contents as plain text, as HFTarget.encode does for one user turn.
        return "\n\n".join(c for _, c in self.messages), False, True


#: ``--reasoning`` levels that switch thinking on or off; anything else is a reasoning level.
REASONING_SWITCH = ("on", "off")
_LEVEL_KEYS = ("reasoning_strength", "reasoning_effort")  # z-lab's order


def reasoning_template_kwargs(reasoning: str | None, template: str | None) -> dict[str, Any]:
    """``--reasoning`` → chat-template kwargs, exactly as z-lab's ``dflash benchmark`` maps it
    (``dflash/benchmark.py`` ``_reasoning_kwargs``): ``on``/``off`` → ``enable_thinking``, which the template
    must mention; a level → ``reasoning_strength`` or ``reasoning_effort``, the first the template mentions."""
    if reasoning is None:
        return {}
    text = template or ""
    if reasoning.strip().lower() in REASONING_SWITCH:
        reasoning = reasoning.strip().lower()
        if "enable_thinking" not in text:
            raise UsageError(f"--reasoning {reasoning}: the target's chat template has no enable_thinking switch "
                             "(pass the template's own variable with --chat-template-kwargs)")
        return {"enable_thinking": reasoning == "on"}
    for key in _LEVEL_KEYS:
        if key in text:
            return {key: reasoning}
    raise UsageError(f"--reasoning {reasoning}: the target's chat template takes no reasoning level "
                     f"({' / '.join(_LEVEL_KEYS)}); use --reasoning on or off")


def template_kwargs_for(tokenizer: Any, reasoning: str | None,
                        chat_template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The chat-template kwargs a target's prompts are rendered with: ``--reasoning`` mapped for the tokenizer's
    template (`reasoning_template_kwargs`), then the user's ``--chat-template-kwargs`` over them."""
    template = getattr(tokenizer, "chat_template", None)
    return {**reasoning_template_kwargs(reasoning, template if isinstance(template, str) else None),
            **dict(chat_template_kwargs or {})}


def parse_template_kwargs(text: str | None) -> dict[str, Any]:
    """``--chat-template-kwargs JSON``: a JSON object, or a one-line usage error."""
    if text is None:
        return {}
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except ValueError as exc:  # _finite_float / _no_constant: NaN, Infinity, 1e999 (no JSON reader takes them back)
        if not isinstance(exc, json.JSONDecodeError):
            raise UsageError(f"--chat-template-kwargs: {exc} — give finite numbers") from None
        raise UsageError(f"--chat-template-kwargs: not valid JSON ({exc.msg}) — give an object such as "
                         "'{\"enable_thinking\": false}'") from None
    except RecursionError:  # a few bytes of brackets: bounded here, not a crash
        raise UsageError("--chat-template-kwargs: JSON nested too deeply — give an object such as "
                         "'{\"enable_thinking\": false}'") from None
    if not isinstance(value, dict):
        raise UsageError(f"--chat-template-kwargs: expected a JSON object, got a JSON {type(value).__name__}")
    clash = [k for k in value if k in RESERVED_TEMPLATE_KWARGS]
    if clash:
        raise UsageError(f"--chat-template-kwargs: {clash[0]!r} is an argument of the chat-template call itself, not a "
                         "template variable (dflash-accept sets the conversation and the generation prompt; the "
                         "template is the target's own)")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def builtin_prompts_path() -> Path:
    return Path(str(resources.files("dflashkit.runtime").joinpath("prompts.jsonl")))


#: the most prompts one file may hold (each is a run; a 24 MB file of one-character lines parsed to 6 M prompts)
MAX_PROMPTS = 100_000


def load_prompts(path: str | os.PathLike | None = None, limit: int | None = None) -> list[Prompt]:
    """Prompts from a JSONL file (the built-in chat / code / math / long-context set when ``path`` is None).

    Each line: ``{"messages": [{"role": "user", "content": "..."}, ...]}`` (chat template),
    ``{"prompt": "..."}`` or a bare JSON string (one user turn, chat template), or ``{"text": "..."}``
    (raw text, tokenized as is); optional ``"id"`` and ``"category"``.
    """
    src = Path(path) if path is not None else builtin_prompts_path()
    try:
        if src.is_dir():
            raise DFlashError(f"{src}: is a directory, not a prompts file (JSONL)")
        raw = read_bounded(src, MAX_PROMPTS_FILE_BYTES)  # a FIFO never blocks the open
        if len(raw) > MAX_PROMPTS_FILE_BYTES:
            raise DFlashError(f"{src}: the prompts file is over {MAX_PROMPTS_FILE_BYTES >> 20} MiB — give a smaller "
                              "one (--max-prompts uses only the first N of a file)")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise DFlashError(f"{src}: no such prompts file") from None
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DFlashError(f"{src}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {column} of the line) — "
                          "save the prompts file as UTF-8") from None
    except OSError as exc:
        raise DFlashError(f"{src}: cannot read the prompts file ({exc})") from None
    prompts, seen = [], {}
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_PROMPT_LINE_BYTES:  # characters ≤ bytes: a cheap first bound
            raise DFlashError(f"{src}:{n}: a prompt line over {MAX_PROMPT_LINE_BYTES >> 10} KiB — shorten it")
        prompt = _parse_prompt(line.rstrip("\r"), src, n)
        if prompt.id in seen:
            raise DFlashError(f"{src}:{n}: prompt id {prompt.id!r} is also the id of line {seen[prompt.id]} — give "
                              "each prompt its own id")
        seen[prompt.id] = n
        prompts.append(prompt)
        if limit is not None and len(prompts) >= limit:  # --max-prompts: the rest is never parsed
            break
        if len(prompts) > MAX_PROMPTS:
            raise DFlashError(f"{src}: over {MAX_PROMPTS} prompts — give fewer (--max-prompts uses the first N)")
    if not prompts:
        raise DFlashError(f"{src}: no prompts (expected one JSON object per line)")
    return prompts


_PROMPT_FORMS = '{"messages": [{"role": "user", "content": "..."}]}, {"prompt": "..."} or {"text": "..."}'


def _parse_prompt(line: str, src: Path, n: int) -> Prompt:
    where = f"{src}:{n}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DFlashError(f"{where}: not valid JSON ({exc.msg}) — each line must be {_PROMPT_FORMS}") from None
    except RecursionError:
        raise DFlashError(f"{where}: JSON nested too deeply — each line must be {_PROMPT_FORMS}") from None
    except ValueError as exc:  # e.g. an integer of over 4,300 digits (Python's int-from-string limit)
        raise DFlashError(f"{where}: not valid JSON ({str(exc).split(';')[0]}) — each line must be {_PROMPT_FORMS}") \
            from None
    if _has_lone_surrogate(obj):
        raise DFlashError(f"{where}: a string holds a lone surrogate (an unpaired \\ud800–\\udfff escape): not "
                          "text any tokenizer can encode — fix the escape")
    if isinstance(obj, str):
        obj = {"prompt": obj}
    if not isinstance(obj, dict):
        raise DFlashError(f"{where}: expected {_PROMPT_FORMS}, got a JSON {type(obj).__name__}")
    pid, category = _label(obj, "id", where) or f"{src.stem}:{n}", _label(obj, "category", where)
    given = [k for k in ("messages", "prompt", "text") if k in obj]
    if len(given) != 1:
        raise DFlashError(f"{where}: give exactly one of messages / prompt / text (found {given or 'none'})")
    if "text" in obj or "prompt" in obj:
        value = obj[given[0]]
        if not isinstance(value, str) or not value:
            raise DFlashError(f"{where}: '{given[0]}' must be a non-empty string")
        if "text" in obj:
            return Prompt(pid, category, text=value)
        return Prompt(pid, category, messages=(("user", value),))
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise DFlashError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects")
    out = []
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DFlashError(f"{where}: messages[{i}] needs string 'role' and 'content'")
        out.append((m["role"], m["content"]))
    return Prompt(pid, category, messages=tuple(out))


#: the longest prompt id or category: each is a cell of every report table (a 900 KB category padded every row)
MAX_LABEL_CHARS = 128
_JSON_KINDS = {bool: "boolean", list: "list", dict: "object", float: "number"}


def _label(obj: dict[str, Any], key: str, where: str) -> str:
    """A prompt's ``id`` or ``category``: a string (an id may be a whole number); absent or null is ''."""
    value = obj.get(key)
    if value is None:
        return ""
    if key == "id" and type(value) is int:
        value = str(value)
    if not isinstance(value, str):
        kind = _JSON_KINDS.get(type(value), "number")
        raise DFlashError(f"{where}: {key!r} must be a string{' or a whole number' if key == 'id' else ''}, got a "
                          f"JSON {kind} — quote it")
    if len(value) > MAX_LABEL_CHARS:
        raise DFlashError(f"{where}: {key!r} is {len(value):,} characters, over {MAX_LABEL_CHARS} — shorten it")
    return value


def _has_lone_surrogate(value: Any, depth: int = 0) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if depth > 64:
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k, depth + 1) or _has_lone_surrogate(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v, depth + 1) for v in value)
    return False


