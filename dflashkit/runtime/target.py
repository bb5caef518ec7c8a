"""Run an HF target model with transformers to get what a drafter reads: tap hidden states.

The tap features are extracted exactly as z-lab's ``extract_context_feature``: transformers'
``hidden_states`` tuple starts with the embedding output, so decoder layer ``i``'s output is
``hidden_states[i + 1]`` (offset 1), and the taps are concatenated in ``target_layer_ids`` order.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from ..target_rules import taps_out_of_range
from ..errors import DFlashError
from ..templates import render_bounded
from .dflash import Linear, TargetHead
from .load import resolve_device, resolve_dtype

#: The built-in parity prompt (fixed, so runs are comparable across files and machines).
DEFAULT_PROMPT = (
    "Write a short Python function that returns the n-th Fibonacci number, then explain in two "
    "sentences why the iterative version is faster than the naive recursive one."
)


def extract_context_feature(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """z-lab's tap rule: ``cat([hidden_states[i + 1] for i in layer_ids], -1)``."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No loading progress bars or info logs on the terminal while a target loads."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


#: the target folder's files transformers reads besides the weights
TARGET_TEXT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "added_tokens.json",
                     "vocab.json", "merges.txt", "tokenizer.model")


def cache_argument(model: torch.nn.Module, cache: object) -> dict[str, object]:
    """The keyword a transformers model takes its KV cache by: ``cache`` from transformers 5.24 on (where
    ``past_key_values`` still works but prints a FutureWarning, and goes in 6.0), ``past_key_values`` before."""
    return {_cache_keyword(type(model)): cache}


@functools.cache
def _cache_keyword(kind: type) -> str:
    return "cache" if "cache" in inspect.signature(kind.forward).parameters else "past_key_values"


class HFTarget:
    """A transformers causal LM plus its tokenizer, loaded from a local HF directory."""

    def __init__(self, directory: str | os.PathLike, *, device: str = "cpu", dtype: str = "float32") -> None:
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError:
            raise DFlashError("running an HF target needs transformers: pip install 'transformers==5.15.0'") from None
        self.path = Path(directory)
        if not (self.path / "config.json").is_file():
            raise DFlashError(f"target {self.path}: not an HF model directory (no config.json)")
        self.device, self.dtype = resolve_device(device), resolve_dtype(dtype)
        for name in TARGET_TEXT_FILES:  # transformers reads a FIFO or a device as "absent" (or blocks on it)
            f = self.path / name
            if os.path.lexists(f) and not f.is_file():
                raise DFlashError(f"target {self.path}: {name} is not a regular file — replace it with the file itself")
        if not any(self.path.glob("*.safetensors")):
            pickles = sorted(p.name for p in self.path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
            what = f"only pickle weights ({self.path / pickles[0]})" if pickles else "no *.safetensors weights"
            raise DFlashError(
                f"target {self.path}: {what} — dflashkit loads safetensors only and never unpickles; "
                "convert the weights with save_pretrained(..., safe_serialization=True)"
            )
        try:
            with _quiet_transformers():
                self.model = AutoModelForCausalLM.from_pretrained(
                    self.path, dtype=self.dtype, use_safetensors=True  # never the pickle beside it
                ).to(self.device).eval()
        except (OSError, ValueError, KeyError) as exc:
            raise DFlashError(f"target {self.path}: transformers cannot load it ({str(exc).splitlines()[0]})") from None
        try:
            with _quiet_transformers():
                self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        except Exception as exc:  # noqa: BLE001 - a tokenizer's files are input: whatever breaks in them is one line
            first = (str(exc).splitlines() or [""])[0][:300]
            raise DFlashError(f"target {self.path}: its tokenizer does not load ({type(exc).__name__}: {first}) — "
                              "check tokenizer_config.json (chat_template: a string, or a list of "
                              "{\"name\", \"template\"} objects) and tokenizer.json") from None
        # every command checks a prompt against the model's context itself (one line naming the prompt), so the
        # tokenizer's own "longer than the specified maximum" log line is only noise on the terminal
        self.tokenizer.model_max_length = 1 << 62
        self.n_layers = int(self.model.config.get_text_config().num_hidden_layers)

    def encode(self, prompt: str) -> list[int]:
        """Token ids of a user prompt, through the chat template when the tokenizer has one
        (as z-lab's benchmark does)."""
        if getattr(self.tokenizer, "chat_template", None):
            text = render_bounded(lambda: self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            ), f"the chat template of {self.path}")
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return list(self.tokenizer.encode(prompt))

    def stream(self, prompt_ids: Sequence[int], layer_ids: Iterable[int]) -> GreedyStream:
        """The prompt and the target's greedy continuation, grown on demand (see `GreedyStream`)."""
        return GreedyStream(self, prompt_ids, layer_ids)

    def check_taps(self, layer_ids: Iterable[int]) -> None:
        """The tap rule of every command (`dflashkit.target_rules.taps_out_of_range`: ids 0 .. n_layers − 2)."""
        bad = taps_out_of_range(list(layer_ids), self.n_layers)
        if bad:
            raise DFlashError(
                f"target {self.path}: has {self.n_layers} layers, the drafter taps layer id(s) {bad} (ids must be "
                f"0 .. {self.n_layers - 2}: llama.cpp aborts on the last layer's, transformers would give its normed output) — "
                "wrong target"
            )

    @torch.inference_mode()
    def tap_features(self, ids: Sequence[int], layer_ids: Sequence[int]) -> torch.Tensor:
        """[1, len(ids), n_taps × hidden] tap hidden states (float32), from one full forward."""
        self.check_taps(layer_ids)
        x = torch.tensor([list(ids)], device=self.device)
        out = self.model(x, output_hidden_states=True, use_cache=False)
        return extract_context_feature(out.hidden_states, layer_ids).float()

    def head(self, *, device: str | torch.device | None = None, dtype: str | torch.dtype = "float32") -> TargetHead:
        """The target's ``embed_tokens`` and ``lm_head`` as a `TargetHead` (shared, not copied, when
        device and dtype match)."""
        dev, dt = resolve_device(device or self.device), resolve_dtype(dtype)
        embed = self.model.get_input_embeddings().weight.detach().to(device=dev, dtype=dt)
        out = self.model.get_output_embeddings()
        lm = Linear(out.weight.shape[1], out.weight.shape[0])
        lm.set_weight(out.weight.detach().to(device=dev, dtype=dt))
        if getattr(out, "bias", None) is not None:
            lm.bias = out.bias.detach().to(device=dev, dtype=dt)
        return TargetHead(embed, lm, source=str(self.path))


class GreedyStream:
    """The prompt followed by the target's own greedy continuation, with every token's tap features.

    With greedy speculative decoding the output is exactly this continuation, whatever the drafter
    proposes. Tokens are generated only as far as they are asked for; each token's hidden states
    come from the (KV-cached) forward that fed it — as in ``dflash_generate``, where they come from
    the prefill and the verify passes.
    """

    def __init__(self, target: HFTarget, prompt_ids: Sequence[int], layer_ids: Iterable[int]) -> None:
        from transformers import DynamicCache

        self.target = target
        self.tokens: list[int] = list(prompt_ids)
        self.layers = sorted(set(layer_ids))
        target.check_taps(self.layers)
        self.fed = 0  # tokens already run through the target
        self.hidden: dict[int, list[torch.Tensor]] = {i: [] for i in self.layers}
        self._cache = DynamicCache(config=target.model.config)

    @torch.inference_mode()
    def _step(self) -> None:
        """Feed every token not fed yet, keep their hidden states, append the next greedy token."""
        x = torch.tensor([self.tokens[self.fed :]], device=self.target.device)
        out = self.target.model(x, **cache_argument(self.target.model, self._cache), use_cache=True,
                                output_hidden_states=True)
        for i in self.layers:
            self.hidden[i].append(out.hidden_states[i + 1][0].float())  # offset 1, as extract_context_feature
        self.fed = len(self.tokens)
        self.tokens.append(int(torch.argmax(out.logits[0, -1])))

    def ensure_tokens(self, n: int) -> None:
        while len(self.tokens) < n:
            self._step()

    def features(self, layer_ids: Sequence[int], start: int, end: int) -> torch.Tensor:
        """[1, end - start, n_taps × hidden]: the tap features of tokens start..end-1, in tap order."""
        while self.fed < end:
            self._step()
        taps = [torch.cat(self.hidden[i])[start:end] for i in layer_ids]
        return torch.cat(taps, dim=-1)[None]
