"""Variants of the llama.cpp ``dflash`` GGUF layout in circulation that current llama.cpp misreads or refuses
(facts: llama.cpp 0.3.36 and the converters named below), as a table: how each is recognised from its metadata, and how its
metadata reads in the current layout.

- ``pre-merge``: written before llama.cpp's DFlash support was merged — ``dflash.mask_token_id`` and
  ``dflash.target_layer_ids`` (raw HF decoder-layer ids), no ``dflash.target_layers``. Current builds
  refuse it ("DFlash model requires 'target_layers' in GGUF metadata"). Read here as the current layout:
  the mask id moves to ``tokenizer.ggml.mask_token_id``, the taps to ``dflash.target_layers`` = HF id + 1.
- ``raw-taps``: a ``dflash`` file that carries ``dflash.n_target_features`` — a key upstream never writes,
  kept by tools that rename the ``dflash-draft`` lineage's keys without converting the tap ids (beellama's
  ``convert-dflash-draft-to-upstream.py``): its ``dflash.target_layers`` are raw HF ids, one layer early.
  Nothing in the file proves it, so it is read as stored; ``--taps-are-raw`` (translation) adds the + 1.

`open_drafter` reads a pre-merge file through `current_layout`, Inspect reports both variants with the
command that fixes them, translation rewrites them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

PRE_MERGE = "pre-merge"
RAW_TAPS = "raw-taps"

ARCH = "dflash"
PRE_MERGE_MASK_KEY = "dflash.mask_token_id"
PRE_MERGE_TAPS_KEY = "dflash.target_layer_ids"
RAW_TAPS_KEY = "dflash.n_target_features"
TAPS_KEY = "dflash.target_layers"
MASK_KEY = "tokenizer.ggml.mask_token_id"
#: keys of the variants that the current layout does not have (dropped on translation)
VARIANT_KEYS = (PRE_MERGE_MASK_KEY, PRE_MERGE_TAPS_KEY, RAW_TAPS_KEY)


def detect_variant(metadata: Mapping[str, Any]) -> str | None:
    """`PRE_MERGE`, `RAW_TAPS` or None (the current layout, or not a ``dflash`` file)."""
    if metadata.get("general.architecture") != ARCH:
        return None
    if TAPS_KEY not in metadata and PRE_MERGE_MASK_KEY in metadata:
        return PRE_MERGE
    if RAW_TAPS_KEY in metadata:
        return RAW_TAPS
    return None


def current_layout(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A pre-merge file's metadata in the current layout (other files unchanged): the mask id under
    ``tokenizer.ggml.mask_token_id``, the raw tap ids as ``dflash.target_layers`` (+ 1)."""
    out = dict(metadata)
    if detect_variant(metadata) != PRE_MERGE:
        return out
    out.setdefault(MASK_KEY, out.pop(PRE_MERGE_MASK_KEY))
    out.pop(PRE_MERGE_MASK_KEY, None)
    taps = out.pop(PRE_MERGE_TAPS_KEY, None)
    # a GGUF numeric array reads as a `NumericArray` (a Sequence), a JSON-ish caller may pass a list
    if isinstance(taps, Sequence) and not isinstance(taps, (str, bytes)):
        out[TAPS_KEY] = [int(i) + 1 for i in taps]
    return out
