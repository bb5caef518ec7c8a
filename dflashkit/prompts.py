"""The prompts of ``dflash-accept``: a JSONL file (chat ``messages`` or raw text) or the built-in set, and the chat
template's switches (``--reasoning``, ``--chat-template-kwargs``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from .errors import DFlashError, UsageError
from .runtime import HFTarget



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
            text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **(template_kwargs or {}))
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
    if reasoning in REASONING_SWITCH:
        if "enable_thinking" not in text:
            raise UsageError(f"--reasoning {reasoning}: the target's chat template has no enable_thinking switch "
                             "(pass the template's own variable with --chat-template-kwargs)")
        return {"enable_thinking": reasoning == "on"}
    for key in _LEVEL_KEYS:
        if key in text:
            return {key: reasoning}
    raise UsageError(f"--reasoning {reasoning}: the target's chat template takes no reasoning level "
                     f"({' / '.join(_LEVEL_KEYS)}); use --reasoning on or off")


def parse_template_kwargs(text: str | None) -> dict[str, Any]:
    """``--chat-template-kwargs JSON``: a JSON object, or a one-line usage error."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--chat-template-kwargs: not valid JSON ({exc.msg}) — give an object such as "
                         "'{\"enable_thinking\": false}'") from None
    except RecursionError:  # a few bytes of brackets: bounded here, not a crash
        raise UsageError("--chat-template-kwargs: JSON nested too deeply — give an object such as "
                         "'{\"enable_thinking\": false}'") from None
    if not isinstance(value, dict):
        raise UsageError(f"--chat-template-kwargs: expected a JSON object, got a JSON {type(value).__name__}")
    return value


def builtin_prompts_path() -> Path:
    return Path(str(resources.files("dflashkit.runtime").joinpath("prompts.jsonl")))


def load_prompts(path: str | os.PathLike | None = None) -> list[Prompt]:
    """Prompts from a JSONL file (the built-in chat/code/math set when ``path`` is None).

    Each line: ``{"messages": [{"role": "user", "content": "..."}, ...]}`` (chat template),
    ``{"prompt": "..."}`` or a bare JSON string (one user turn, chat template), or ``{"text": "..."}``
    (raw text, tokenized as is); optional ``"id"`` and ``"category"``.
    """
    src = Path(path) if path is not None else builtin_prompts_path()
    try:
        lines = src.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DFlashError(f"{src}: no such prompts file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DFlashError(f"{src}: cannot read the prompts file ({exc})") from None
    prompts = [_parse_prompt(line, src, n) for n, line in enumerate(lines, 1) if line.strip()]
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
    if isinstance(obj, str):
        obj = {"prompt": obj}
    if not isinstance(obj, dict):
        raise DFlashError(f"{where}: expected {_PROMPT_FORMS}, got a JSON {type(obj).__name__}")
    pid, category = str(obj.get("id", f"{src.stem}:{n}")), str(obj.get("category", ""))
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


