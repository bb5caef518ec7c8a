"""The target model a drafter serves: its shape and tokenizer, read without its weights.

``--target`` names either the target's GGUF (only the header is parsed, via the project's
hardened reader) or its HF directory (only config.json and the tokenizer files are read). Either
way: hidden size, layer count, vocab size and the tokenizer metadata to copy into the drafter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashkit.converters.tokenizer import (
    KEY_TOKENS,
    TokenizerMetadata,
    tokenizer_from_gguf,
    tokenizer_from_hf_dir,
)
from dflashkit import bounds
from dflashkit.errors import DFlashError
from dflashkit.files import read_json
from dflashkit.io.gguf_reader import open_gguf

GGUF_MAGIC = b"GGUF"
_FIX = "pass the target's .gguf file or its HF model directory (the one with config.json)"


@dataclass(frozen=True)
class TargetInfo:
    path: str
    kind: str  # "gguf" | "hf"
    architecture: str | None  # general.architecture, or config.json architectures[0]
    name: str | None  # general.name / file or directory name
    hidden_size: int
    n_layers: int
    vocab_size: int
    tokenizer: TokenizerMetadata | None
    metadata: dict[str, Any]  # raw KV values (GGUF) or config.json (HF), e.g. for instruct-vs-base


def load_target(path: str | os.PathLike[str]) -> TargetInfo:
    """Read a target model's shape and tokenizer from its GGUF header or its HF directory."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise DFlashError(f"target {p}: directory has no config.json; {_FIX}")
        return _load_hf(p)
    if p.is_file():
        if p.name == "config.json":  # a natural slip: the config instead of its directory
            return _load_hf(p.parent)
        if not _has_gguf_magic(p):
            raise DFlashError(f"target {p}: not a GGUF file (no GGUF magic); {_FIX}")
        return _load_gguf(p)
    if p.exists():
        raise DFlashError(f"target {p}: neither a file nor a directory; {_FIX}")
    raise DFlashError(f"target {p}: no such file or directory; {_FIX}")


def _has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError as exc:
        raise DFlashError(f"target {path}: cannot read it ({exc.strerror or exc}); {_FIX}") from None


# --------------------------------------------------------------------------------------------
# HF directory


def _load_hf(directory: Path) -> TargetInfo:
    config_path = directory / "config.json"
    config = read_json(config_path, hint="; re-download the file")
    if not isinstance(config, dict):
        raise DFlashError(f"{config_path}: expected a JSON object; re-download the file")
    # Multimodal configs (Gemma 3/4, Qwen3.5, ...) keep the language model's values in text_config.
    text_config = config.get("text_config")
    scopes = [text_config, config] if isinstance(text_config, dict) else [config]

    def value(key: str) -> int:
        for scope in scopes:
            if key in scope:
                return _positive_int(scope[key], config_path, key)
        where = "text_config or the top level" if len(scopes) == 2 else "the top level"
        raise DFlashError(f"{config_path}: missing {key!r} (looked in {where}); the target config must define it")

    hidden_size = value("hidden_size")
    n_layers = value("num_hidden_layers")
    vocab_size = value("vocab_size")
    architectures = config.get("architectures")
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    return TargetInfo(
        path=str(directory),
        kind="hf",
        architecture=architecture if isinstance(architecture, str) else None,
        name=directory.resolve().name or None,
        hidden_size=hidden_size,
        n_layers=n_layers,
        vocab_size=vocab_size,
        tokenizer=tokenizer_from_hf_dir(directory, vocab_size),
        metadata=config,
    )


def _positive_int(value: Any, where: Path | str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DFlashError(f"{where}: {key!r} is {bounds.quote(value)}, expected a positive integer; fix or re-download the file")
    cap = bounds.MAX_VOCAB if key.endswith("vocab_size") else bounds.MAX_LAYERS if key.endswith(("layers", "block_count")) else bounds.MAX_WIDTH
    if value > cap:  # sizes per-token / per-layer work downstream
        raise DFlashError(f"{where}: {key!r} is {value}, more than {cap}; fix or re-download the file")
    return value


# --------------------------------------------------------------------------------------------
# GGUF (header only)


def _load_gguf(path: Path) -> TargetInfo:
    with open_gguf(path) as gguf:
        arch = gguf.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise DFlashError(f"{path}: missing 'general.architecture'; re-convert the target with llama.cpp")

        def value(key: str) -> int:
            if key not in gguf.kvs:
                raise DFlashError(f"{path}: missing {key!r}; re-convert the target with llama.cpp")
            return _positive_int(gguf.get(key), path, key)

        hidden_size = value(f"{arch}.embedding_length")
        n_layers = value(f"{arch}.block_count")
        tokenizer = tokenizer_from_gguf(gguf)
        # llama.cpp's converter does not always write {arch}.vocab_size: then the token list,
        # then token_embd's row count (tensor info only, no data) give it.
        if f"{arch}.vocab_size" in gguf.kvs:
            vocab_size = value(f"{arch}.vocab_size")
        elif tokenizer is not None and tokenizer.get(KEY_TOKENS) is not None:
            vocab_size = tokenizer.vocab_size
        elif "token_embd.weight" in gguf.tensors:
            vocab_size = gguf.tensors["token_embd.weight"].shape[0]
        else:
            raise DFlashError(
                f"{path}: no '{arch}.vocab_size', tokenizer.ggml.tokens or token_embd.weight to tell "
                f"the vocab size; re-convert the target with llama.cpp"
            )
        name = gguf.get("general.name")
        return TargetInfo(
            path=str(path),
            kind="gguf",
            architecture=arch,
            name=name if isinstance(name, str) and name else path.stem,
            hidden_size=hidden_size,
            n_layers=n_layers,
            vocab_size=vocab_size,
            tokenizer=tokenizer,
            metadata={key: kv.value for key, kv in gguf.kvs.items()},
        )
