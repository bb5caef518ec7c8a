"""DSpark checks on a drafter GGUF: the family (SpecForge/DeepSpec or speculators DSpark, Gemma-4 DSpark)
and its heads, as llama.cpp's loader (``src/models/dflash.cpp``) reads them.

- ``d2t``: I64 (the loader asserts it), one row per draft-vocabulary row = ``output.weight``'s rows,
  absolute target ids in range of the vocabulary and unique (a duplicate or an offset left unconverted
  scatters draft logits onto the wrong tokens);
- ``markov_w1`` {rank, n_vocab}, ``markov_w2`` {rank, n_vocab_draft} (+ optional ``markov_w2.scale`` {1});
- ``conf_proj`` {n_embd + rank, 1} (+ ``conf_proj.bias`` {1}), and ``dflash.has_confidence_head`` saying so.

Shapes are given ne0-first (GGUF order) in the messages, as llama.cpp logs them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dflashkit.drafters import DrafterFile
from dflashkit.inspect.checks import InspectContext, register_check
from dflashkit.inspect.drafter import drafter_of
from dflashkit.inspect.findings import Finding, error, info, warning

D2T, W1, W2, W2_SCALE = "d2t", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "markov_head.markov_w2.scale"
CONF_W, CONF_B = "confidence_head.proj.weight", "confidence_head.proj.bias"
DSPARK_FAMILIES = ("dspark", "speculators-dspark", "gemma4-dspark")


def _ne(shape: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(d) for d in reversed(shape)) + "}"


def _name(d: DrafterFile, canonical: str) -> str:
    return d.tensors[canonical].name


@register_check("drafter.dspark", kinds=("gguf",), order=210)
def check_dspark_heads(ctx: InspectContext) -> Iterator[Finding]:
    d = drafter_of(ctx)
    if d is None or d.spec is None or d.family is None:
        return
    has_heads = any(c in d.tensors for c in (D2T, W1, W2, CONF_W))
    if d.family.name not in DSPARK_FAMILIES and not has_heads:
        return
    spec, path = d.spec, ctx.path
    arch = d.architecture
    tokens = d.metadata.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, list) and tokens else spec.vocab_size
    ctx.summary["family"] = d.family.name
    if d.family.name not in DSPARK_FAMILIES:
        # d2t alone is a DFlash drafter with a reduced vocabulary (speculators DFlash, 13C): no DSpark flags
        if any(c in d.tensors for c in (W1, W2, CONF_W)):
            yield error(
                "dspark.flags_missing",
                f"{path}: DSpark head tensors ({', '.join(_name(d, c) for c in (D2T, W1, W2, CONF_W) if c in d.tensors)}) but no "
                f"{arch}.has_confidence_head / {arch}.sample_from_anchor keys — re-convert with dflash-convert",
            )
    else:
        yield info(
            "dspark.family",
            f"{path}: DSpark drafter ({d.family.name}): Markov rank {spec.markov_rank}, draft vocabulary "
            f"{spec.draft_vocab_size or n_vocab}, confidence head {'yes' if spec.has_confidence_head else 'no'}, "
            f"sample_from_anchor {spec.sample_from_anchor if spec.sample_from_anchor is not None else 'absent (loader: true)'}",
            family=d.family.name, markov_rank=spec.markov_rank, draft_vocab=spec.draft_vocab_size or n_vocab,
            has_confidence_head=spec.has_confidence_head, sample_from_anchor=spec.sample_from_anchor,
        )
    yield from _check_d2t(ctx, d, n_vocab)
    yield from _check_markov(ctx, d, n_vocab)
    yield from _check_confidence(ctx, d)


def _check_d2t(ctx: InspectContext, d: DrafterFile, n_vocab: int | None) -> Iterator[Finding]:
    ref = d.tensors.get(D2T)
    output = d.tensors.get("lm_head.weight")
    if ref is None:
        return
    path = ctx.path
    if ref.type_name != "I64":
        yield error(
            "dspark.d2t_type",
            f"{path}: tensor '{ref.name}' is {ref.type_name} but llama.cpp's loader asserts I64 — re-convert with dflash-convert",
            type=ref.type_name,
        )
    if len(ref.shape) != 1:
        yield error("dspark.d2t_shape", f"{path}: tensor '{ref.name}' has shape {_ne(ref.shape)}; expected one dimension", shape=list(ref.shape))
        return
    n = ref.shape[0]
    if output is None:
        yield error(
            "dspark.d2t_output_missing",
            f"{path}: tensor '{ref.name}' maps {n} draft rows but the file has no output head (output.weight "
            f"{{n_embd, {n}}}) — re-convert with dflash-convert",
            rows=n,
        )
    elif output.shape[0] != n:
        yield error(
            "dspark.d2t_length",
            f"{path}: tensor '{ref.name}' has {n} rows but '{output.name}' has {output.shape[0]} (ne {_ne(output.shape)}); "
            "they must agree — the draft head and its token map come from one checkpoint",
            d2t_rows=n, output_rows=output.shape[0],
        )
    if ref.type_name not in ("I64", "I32", "I16", "I8"):
        return
    ids = np.asarray(d.read_raw(D2T)).astype(np.int64).reshape(-1)
    if n_vocab is not None:
        bad = np.flatnonzero((ids < 0) | (ids >= n_vocab))
        if bad.size:
            i = int(bad[0])
            yield error(
                "dspark.d2t_range",
                f"{path}: tensor '{ref.name}' has {bad.size} target id(s) outside the vocabulary (0..{n_vocab - 1}); "
                f"first: row {i} → {int(ids[i])} — re-convert with dflash-convert",
                count=int(bad.size), row=i, target_id=int(ids[i]), vocab=n_vocab,
            )
    unique, counts = np.unique(ids, return_counts=True)
    if unique.size != ids.size:
        dup = int(unique[counts > 1][0])
        rows = np.flatnonzero(ids == dup)[:2].tolist()
        # offsets of sorted target ids are non-decreasing and repeat wherever target ids are consecutive
        absolute = ids + np.arange(ids.size)
        offsets = ids.size - unique.size > 1 and bool(np.all(np.diff(absolute) > 0)) and bool(np.all(np.diff(ids) >= 0))
        hint = (" — it looks like speculators' offsets (target id = d2t[i] + i) stored as is; re-convert with dflash-convert"
                if offsets else " — re-convert with dflash-convert")
        yield error(
            "dspark.d2t_duplicate",
            f"{path}: tensor '{ref.name}' maps {ids.size - unique.size} draft row(s) onto a target id another row "
            f"already has (target id {dup} at rows {rows}){hint}",
            target_id=dup, rows=rows,
        )


def _check_markov(ctx: InspectContext, d: DrafterFile, n_vocab: int | None) -> Iterator[Finding]:
    path = ctx.path
    w1, w2 = d.tensors.get(W1), d.tensors.get(W2)
    if w1 is None and w2 is None:
        return
    if w1 is None or w2 is None:
        have, lack = (w1, "markov_w2.weight") if w1 is not None else (w2, "markov_w1.weight")
        yield error("dspark.markov_incomplete", f"{path}: tensor '{have.name}' without '{lack}' — the Markov head needs both")
        return
    rank = w1.shape[1] if len(w1.shape) == 2 else None
    if len(w1.shape) != 2 or (n_vocab is not None and w1.shape[0] != n_vocab):
        yield error(
            "dspark.markov_w1_shape",
            f"{path}: tensor '{w1.name}' is ne {_ne(w1.shape)} but llama.cpp's loader needs {{rank, n_vocab = {n_vocab}}}",
            shape=list(reversed(w1.shape)), vocab=n_vocab,
        )
    output = d.tensors.get("lm_head.weight")
    d2t = d.tensors.get(D2T)
    n_draft = d2t.shape[0] if d2t is not None and len(d2t.shape) == 1 else (n_vocab if output is None else output.shape[0])
    if len(w2.shape) != 2 or w2.shape[1] != rank or (n_draft is not None and w2.shape[0] != n_draft):
        yield error(
            "dspark.markov_w2_shape",
            f"{path}: tensor '{w2.name}' is ne {_ne(w2.shape)} but llama.cpp's loader needs {{rank = {rank}, "
            f"n_vocab_draft = {n_draft}}}",
            shape=list(reversed(w2.shape)), rank=rank, draft_vocab=n_draft,
        )
    scale = d.tensors.get(W2_SCALE)
    if scale is not None and tuple(scale.shape) != (1,):
        yield error("dspark.markov_scale_shape", f"{path}: tensor '{scale.name}' is ne {_ne(scale.shape)}; the loader needs {{1}}")


def _check_confidence(ctx: InspectContext, d: DrafterFile) -> Iterator[Finding]:
    path, spec = ctx.path, d.spec
    assert spec is not None
    conf, bias = d.tensors.get(CONF_W), d.tensors.get(CONF_B)
    w1 = d.tensors.get(W1)
    flag_key = f"{d.architecture}.has_confidence_head"
    flag = d.metadata.get(flag_key)
    if conf is None:
        if bias is not None:
            yield error("dspark.confidence_incomplete", f"{path}: tensor '{bias.name}' without 'conf_proj.weight'")
        if flag is True:
            yield error("dspark.confidence_flag", f"{path}: {flag_key} is true but the file has no conf_proj.weight")
        return
    if flag is False:
        yield warning(
            "dspark.confidence_flag",
            f"{path}: '{conf.name}' is present but {flag_key} is false — the runtime may skip the confidence head",
        )
    rank = w1.shape[1] if w1 is not None and len(w1.shape) == 2 else None
    want = (1, spec.hidden_size + rank) if rank is not None else None
    if want is not None and tuple(conf.shape) != want:
        yield error(
            "dspark.confidence_shape",
            f"{path}: tensor '{conf.name}' is ne {_ne(conf.shape)} but llama.cpp's loader needs {{n_embd + rank = "
            f"{spec.hidden_size} + {rank}, 1}}",
            shape=list(reversed(conf.shape)), expected=list(reversed(want)),
        )
    if w1 is None:
        yield error("dspark.confidence_without_markov", f"{path}: tensor '{conf.name}' without a Markov head (markov_w1.weight): the loader only reads it with one")
    if bias is not None and tuple(bias.shape) != (1,):
        yield error("dspark.confidence_bias_shape", f"{path}: tensor '{bias.name}' is ne {_ne(bias.shape)}; the loader needs {{1}}")


@register_check("drafter.dspark_checkpoint", kinds=("safetensors",), order=210)
def check_dspark_checkpoint(ctx: InspectContext) -> Iterator[Finding]:
    """An HF DSpark checkpoint: what conversion would refuse about its heads (d2t present when the draft
    vocabulary is reduced, its size, range and uniqueness once made absolute), said before converting."""
    if not ctx.path.is_dir():
        return
    d = drafter_of(ctx)
    if d is None or d.spec is None or d.family is None or d.family.name not in DSPARK_FAMILIES:
        return
    from dflashkit.errors import DFlashError

    shapes = {c: t.shape for c, t in d.tensors.items()}
    try:
        d.family.check_source(d.spec, shapes, str(ctx.path))
        for canonical in d.family.final_tensors:
            if canonical in d.tensors:
                d.family.finalize_tensor(d.spec, canonical, d.read_raw(canonical), str(ctx.path))
    except DFlashError as exc:
        yield error("dspark.checkpoint", str(exc))
