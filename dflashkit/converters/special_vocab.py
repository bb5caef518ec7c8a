"""gguf-py's ``SpecialVocab`` as llama.cpp's converter runs it: merges, special token ids, add_bos/add_eos flags and
chat templates, plus the four rules of the gguf-py vendored in llama.cpp's source tree that the released ``gguf``
package lacks (see `dflashkit.converters.tokenizer`'s docstring: (i) ByteLevel adds no BOS/EOS, (ii) the
post-processor wins over tokenizer_config.json, (iii) a TemplateProcessing leader becomes BOS/CLS, (iv) the
normalizer's lowercase / strip_accents keys).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf import Keys, SpecialVocab

from dflashkit.converters.hf_vocab import _ParsedJson

if TYPE_CHECKING:
    from gguf import GGUFWriter

logger = logging.getLogger(__name__)

# In llama.cpp's vendored gguf-py, not yet in the released gguf package.
KEY_NORMALIZER_LOWERCASE = getattr(Keys.Tokenizer, "NORMALIZER_LOWERCASE", "tokenizer.ggml.normalizer.lowercase")
KEY_NORMALIZER_STRIP_ACCENTS = getattr(
    Keys.Tokenizer, "NORMALIZER_STRIP_ACCENTS", "tokenizer.ggml.normalizer.strip_accents"
)


class _WriteLog(dict):  # type: ignore[type-arg]
    """A dict that remembers every assignment, so the post-processor's flags can be told apart
    from the ``tokenizer_config.json`` ones that the released SpecialVocab writes over them."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, bool]] = []

    def __setitem__(self, key: str, value: bool) -> None:
        self.writes.append((key, value))
        super().__setitem__(key, value)


class _ConverterSpecialVocab(SpecialVocab):
    """``gguf.SpecialVocab`` plus the four rules of llama.cpp's vendored copy the release lacks."""

    normalizer_lowercase: bool | None = None
    normalizer_strip_accents: bool | None = None

    def __init__(self, path: Path, files: _ParsedJson, **kwargs: Any) -> None:
        self._files = files  # set first: SpecialVocab.__init__ loads at once
        super().__init__(path, **kwargs)

    def _try_load_from_tokenizer_json(self, path: Path) -> bool:
        tokenizer = self._files.read_if_present(path / "tokenizer.json") or {}
        config = self._files.read_if_present(path / "tokenizer_config.json")
        self._added_tokens: list[Any] = tokenizer.get("added_tokens") or []
        self.add_special_token = log = _WriteLog()
        done = super()._try_load_from_tokenizer_json(path)
        post = tokenizer.get("post_processor")
        processors = post.get("processors", [post]) if isinstance(post, dict) else []
        self.add_special_token = self._llama_cpp_add_flags(log.writes, processors, config)
        self._normalizer(tokenizer.get("normalizer"))
        return done

    def _try_load_from_config_json(self, path: Path) -> bool:
        # gguf-py's rule (special ids at the top level, else in text_config), except that a text_config
        # that is not an object is no text config, as everywhere in dflashkit (gguf-py raises AttributeError)
        config = self._files.read_if_present(path / "config.json")
        if not isinstance(config, dict):
            return False
        text_config = config.get("text_config")
        text_config = text_config if isinstance(text_config, dict) else {}
        for typ in self.special_token_types:
            token_id = config.get(f"{typ}_token_id")
            self._set_special_token(typ, token_id if token_id is not None else text_config.get(f"{typ}_token_id"))
        return True

    def _llama_cpp_add_flags(
        self, writes: list[tuple[str, bool]], processors: list[Any], config: dict[str, Any] | None
    ) -> dict[str, bool]:
        # The released class assigns tokenizer_config's add_{typ}_token last, over the post-processor:
        # those assignments are the tail of the log. What precedes them is the post-processor's.
        from_config = [
            (typ, config[f"add_{typ}_token"])
            for typ in self.special_token_types
            if config and isinstance(config.get(f"add_{typ}_token"), bool)
        ]
        if from_config and writes[-len(from_config):] == from_config:
            writes = writes[: -len(from_config)]
        flags: dict[str, bool] = {}
        applied = False
        for proc in processors:
            kind = proc.get("type") if isinstance(proc, dict) else None
            if kind == "ByteLevel":  # (i) byte-level BPE adds neither BOS nor EOS
                flags.setdefault("bos", False)
                flags.setdefault("eos", False)
            elif kind in ("RobertaProcessing", "TemplateProcessing") and not applied:
                flags.update(writes)  # what the released class read from these processors
                applied = True
                if kind == "TemplateProcessing" and self._template_leader_becomes_bos(proc, config):
                    flags["bos"] = True
        if not applied:
            flags.update(writes)
        for typ, value in from_config:  # (ii) the post-processor, when it said anything, wins
            if flags.setdefault(typ, value) != value:
                logger.warning("tokenizer_config add_%s_token=%s ignored: the post-processor says %s", typ, value, flags[typ])
        return flags

    def _template_leader_becomes_bos(self, proc: dict[str, Any], config: dict[str, Any] | None) -> bool:
        """(iii) TemplateProcessing's leading special token becomes BOS/CLS where the config names
        none: records their ids and returns True (the template then adds a BOS)."""
        single = proc.get("single") or []
        first = single[0].get("SpecialToken", {}).get("id") if len(single) > 1 else None
        if not first or not config:
            return False
        cls = config.get("cls_token")
        bos = config.get("bos_token") or cls  # the released class already took cls for a missing bos
        if first in (bos, cls) or (bos and cls):
            return False
        token_id = next((a.get("id") for a in self._added_tokens if a.get("content") == first), None)
        for typ, named in (("bos", bos), ("cls", cls)):
            if not named:
                self._set_special_token(typ, token_id)
        # Keep special_token_types order (the released class inserted the others in that order).
        order = {typ: i for i, typ in enumerate(self.special_token_types)}
        self.special_token_ids = dict(sorted(self.special_token_ids.items(), key=lambda kv: order.get(kv[0], len(order))))
        return True

    def _normalizer(self, node: Any) -> None:
        """(iv) tokenizer.json's normalizer: Lowercase / StripAccents / BertNormalizer, nested in Sequence."""
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind == "Lowercase":
            self.normalizer_lowercase = True
        elif kind == "StripAccents":
            self.normalizer_strip_accents = True
        elif kind == "BertNormalizer":
            if "lowercase" in node:
                self.normalizer_lowercase = node["lowercase"]
            if "strip_accents" in node:
                self.normalizer_strip_accents = node["strip_accents"]
        elif kind == "Sequence":
            for child in node.get("normalizers") or []:
                self._normalizer(child)

    def add_to_gguf(self, gw: GGUFWriter, quiet: bool = False) -> None:
        super().add_to_gguf(gw, quiet)
        # gguf-py's add_bool writes a bool only; BertNormalizer may say null, which it skips too.
        if self.normalizer_lowercase is not None and KEY_NORMALIZER_LOWERCASE not in gw.kv_data[0]:
            gw.add_bool(KEY_NORMALIZER_LOWERCASE, self.normalizer_lowercase)
        if self.normalizer_strip_accents is not None and KEY_NORMALIZER_STRIP_ACCENTS not in gw.kv_data[0]:
            gw.add_bool(KEY_NORMALIZER_STRIP_ACCENTS, self.normalizer_strip_accents)
