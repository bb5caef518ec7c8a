"""Instruct vs base: a verdict with the evidence listed, never a bare guess.

Pairing a base target with a drafter trained on the instruct model (or the reverse) passes every
shape check and shows only as collapsed acceptance. Evidence: ``general.finetune``, name/basename
tokens (``it``, ``instruct``, ``chat`` vs ``base``, ``pt``), an end-of-turn token as EOS,
``general.base_model.*`` entries, a chat template. Strong evidence decides; when strong evidence
points both ways the verdict is ``unknown`` with both sides listed. A chat template alone is weak
(base checkpoints often ship one).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashkit.errors import DFlashError
from dflashkit.files import read_json
from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.findings import Finding, error, info

INSTRUCT_TOKENS = {"it", "instruct", "chat", "sft", "dpo", "rlhf", "orpo"}
BASE_TOKENS = {"base", "pt", "pretrain", "pretrained"}
END_OF_TURN = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|eom_id|>", "<|endofturn|>", "<turn|>", "<|end_of_turn|>"}
VERDICTS = ("instruct", "base", "unknown")


@dataclass
class Verdict:
    verdict: str
    instruct: list[str] = field(default_factory=list)  # evidence for instruct ("strong: ..." / "weak: ...")
    base: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.instruct:
            parts.append("instruct: " + "; ".join(self.instruct))
        if self.base:
            parts.append("base: " + "; ".join(self.base))
        return " | ".join(parts) if parts else "no evidence either way"

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "instruct_evidence": self.instruct, "base_evidence": self.base}


def name_tokens(name: str) -> set[str]:
    return {t for t in re.split(r"[^a-z0-9]+", name.lower()) if t}


def judge(evidence: list[tuple[str, str, bool]]) -> Verdict:
    """evidence: (side, description, strong). Strong evidence decides; conflicting strong → unknown."""
    v = Verdict("unknown")
    for side, text, strong in evidence:
        getattr(v, side).append(("strong: " if strong else "weak: ") + text)
    strong_sides = {side for side, _, strong in evidence if strong}
    weak_sides = {side for side, _, strong in evidence if not strong}
    if len(strong_sides) == 1:
        v.verdict = strong_sides.pop()
    elif not strong_sides and len(weak_sides) == 1:
        v.verdict = weak_sides.pop()
    return v


def gguf_evidence(kv: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    ev: list[tuple[str, str, bool]] = []
    finetune = kv.get("general.finetune")
    if isinstance(finetune, str) and finetune:
        toks = name_tokens(finetune)
        if toks & INSTRUCT_TOKENS:
            ev.append(("instruct", f"general.finetune = '{finetune}'", True))
        elif toks & BASE_TOKENS:
            ev.append(("base", f"general.finetune = '{finetune}'", True))
    for key in ("general.name", "general.basename"):
        value = kv.get(key)
        if isinstance(value, str):
            toks = name_tokens(value)
            if toks & INSTRUCT_TOKENS:
                ev.append(("instruct", f"{key} '{value}' has '{sorted(toks & INSTRUCT_TOKENS)[0]}'", True))
            if toks & BASE_TOKENS:
                ev.append(("base", f"{key} '{value}' has '{sorted(toks & BASE_TOKENS)[0]}'", True))
    tokens = kv.get("tokenizer.ggml.tokens")
    eos = kv.get("tokenizer.ggml.eos_token_id")
    if isinstance(tokens, list) and isinstance(eos, int) and 0 <= eos < len(tokens) and tokens[eos] in END_OF_TURN:
        ev.append(("instruct", f"EOS is the end-of-turn token {tokens[eos]}", True))
    if isinstance(kv.get("general.base_model.count"), int) and kv["general.base_model.count"] > 0:
        base_name = kv.get("general.base_model.0.name") or kv.get("general.base_model.0.repo_url") or "?"
        ev.append(("instruct", f"fine-tuned from a base model (general.base_model.0 = '{base_name}')", True))
    if kv.get("tokenizer.chat_template"):
        ev.append(("instruct", "has a chat template", False))
    return ev


def hf_evidence(directory: Path, config: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    ev: list[tuple[str, str, bool]] = []
    name = str(config.get("_name_or_path") or directory.resolve().name)
    toks = name_tokens(name) | name_tokens(directory.resolve().name)
    if toks & INSTRUCT_TOKENS:
        ev.append(("instruct", f"name '{name}' has '{sorted(toks & INSTRUCT_TOKENS)[0]}'", True))
    if toks & BASE_TOKENS:
        ev.append(("base", f"name '{name}' has '{sorted(toks & BASE_TOKENS)[0]}'", True))
    tok_cfg = _read_json(directory / "tokenizer_config.json")
    if tok_cfg:
        eos = tok_cfg.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if eos in END_OF_TURN:
            ev.append(("instruct", f"EOS is the end-of-turn token {eos}", True))
        if tok_cfg.get("chat_template"):
            ev.append(("instruct", "has a chat template", False))
    elif (directory / "chat_template.jinja").is_file():
        ev.append(("instruct", "has a chat template", False))
    return ev


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        if path.is_file():
            data = read_json(path, max_bytes=50_000_000 - 1)
            return data if isinstance(data, dict) else None
    except (OSError, DFlashError):  # read_json names JSONDecodeError, 10,000 digits, deep nesting as DFlashError
        return None
    return None


def verdict_for_path(path: Path, gguf_kv: Mapping[str, Any] | None = None) -> Verdict:
    """Instruct/base verdict for a GGUF (its KV values) or an HF directory."""
    if gguf_kv is not None:
        return judge(gguf_evidence(gguf_kv))
    config = _read_json(path / "config.json") or {}
    return judge(hf_evidence(path, config))


def _ctx_verdict(ctx: InspectContext) -> Verdict | None:
    if ctx.gguf is not None:
        if ctx.has_errors("gguf."):
            return None
        return verdict_for_path(ctx.path, {k: kv.value for k, kv in ctx.gguf.kvs.items()})
    if ctx.path.is_dir():
        return verdict_for_path(ctx.path)
    return None


@register_check("provenance.instruct", order=300)
def check_instruct(ctx: InspectContext) -> Iterator[Finding]:
    v = _ctx_verdict(ctx)
    if v is None:
        return
    ctx.summary["instruct_verdict"] = v.verdict
    ctx.cache["verdict"] = v
    yield info("provenance.verdict", f"{ctx.path}: looks {v.verdict} — {v.describe()}", **v.to_dict())
    if ctx.expect is None:
        return
    if v.verdict == "unknown":
        # A gate that asks for one variant passes only on that verdict: conflicting or missing evidence fails.
        yield error(
            "provenance.expect_unknown",
            f"{ctx.path}: --expect {ctx.expect} but instruct/base cannot be told from the file ({v.describe()})",
            expected=ctx.expect, **v.to_dict(),
        )
    elif v.verdict != ctx.expect:
        yield error(
            "provenance.expect_mismatch",
            f"{ctx.path}: --expect {ctx.expect} but it looks {v.verdict} ({v.describe()}) — wrong model variant downloaded?",
            expected=ctx.expect, **v.to_dict(),
        )
