"""The runtime against z-lab's reference implementation (``dflash`` 0.1.0 on PyPI, ``dflash/model.py``).

Part of the test extra: ``pip install "transformers==5.15.0"`` and ``pip install --no-deps dflash==0.1.0``.

The reference model is z-lab's own ``from_pretrained`` on the checkpoint directory, with z-lab's config class
read from its config.json (never from dflashkit's parsed spec, so a misreading of the config on our side shows
up as a difference). Equality: logits and hidden states within 1e-5 relative in float32, one round and
three rounds with the cache cropped as ``dflash_generate`` does.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import gguf
import gguf.quants
import numpy as np
import pytest
import torch
from dflash import model as zl
from torch import nn
from torch.nn import functional as F
from transformers import Qwen3Config

from conftest import FAMILIES, target_for
from dflashkit.converters.convert import convert
from dflashkit.errors import DFlashError, UsageError
from dflashkit.drafters import open_drafter
from dflashkit.divergences import divergence_causes, hf_config
from dflashkit.runtime import (
    DraftCache,
    HFTarget,
    Linear,
    TargetHead,
    extract_context_feature,
    kernels_available,
    load_drafter,
    load_target_head,
    resolve_device,
    resolve_dtype,
)

warnings.filterwarnings("ignore", module="transformers")
RTOL = 1e-5
ROUNDS_3 = (None, 7, 12)  # tokens accepted before rounds 2 and 3
CTX0 = 40  # first-round context: longer than every fixture's sliding window


# ---------------------------------------------------------------------------------------------
# The reference: z-lab's own config class and from_pretrained, on the checkpoint directory
# ---------------------------------------------------------------------------------------------


def reference_config(path: Path) -> Qwen3Config:
    """z-lab's config (``DFlashDraftModel.config_class``) read from ``path/config.json`` — never from our spec.

    Adjustments, all from config.json's own values: dflash 0.1.0 reads ``num_target_layers`` eagerly even
    when ``dflash_config.target_layer_ids`` is given (then unused), so a placeholder is set where it is missing;
    ``dflash_config.use_swa`` + ``swa_window_size`` (the spelling of the other DFlash lineages, which dflash
    0.1.0 does not read) are written in z-lab's terms: every layer ``sliding_attention`` with that window; and
    a missing ``head_dim`` (the fixture's Gemma-4 drafter: hidden_size // heads, the usual HF convention) is
    spelled out, where Qwen3Config would silently fill its own default of 128; and ``sliding_window``, which
    Qwen3Config drops unless ``use_sliding_window`` is set, is kept as config.json gives it."""
    raw = json.loads((path / "config.json").read_text())
    config = zl.DFlashDraftModel.config_class.from_pretrained(path)
    if raw.get("sliding_window") is not None:
        config.sliding_window = raw["sliding_window"]
    if raw.get("head_dim") is None:
        config.head_dim = raw["hidden_size"] // raw["num_attention_heads"]
    if getattr(config, "num_target_layers", None) is None:
        config.num_target_layers = 36
    dc = getattr(config, "dflash_config", None) or {}
    if dc.get("use_swa"):
        config.layer_types = ["sliding_attention"] * config.num_hidden_layers
        config.sliding_window = dc["swa_window_size"]
    return config


#: fixture families with sliding layers and no is_causal: one llama.cpp flag cannot run them as z-lab does
CAUSALITY_LOST = ("qwen35-swa", "gemma4")


def reference_model(path: Path) -> nn.Module:
    config = reference_config(path)
    cls = zl.DFlash2DraftModel if config.architectures[0] == "DFlash2DraftModel" else zl.DFlashDraftModel
    return cls.from_pretrained(path, config=config, dtype=torch.float32).eval()


class FakeTarget(nn.Module):
    """What the reference borrows from a target: input embeddings and lm_head (random)."""

    def __init__(self, vocab: int, hidden: int, g: torch.Generator) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(torch.randn(vocab, hidden, generator=g))
            self.lm_head.weight.copy_(torch.randn(vocab, hidden, generator=g) * 0.05)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def as_head(self) -> TargetHead:
        lm = Linear(self.lm_head.in_features, self.lm_head.out_features)
        lm.set_weight(self.lm_head.weight.detach().clone())
        return TargetHead(self.embed_tokens.weight.detach().clone(), lm)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|"""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def run_both(ref: nn.Module, ours: nn.Module, rounds: tuple[int | None, ...], seed: int = 0) -> list[dict]:
    """Drive both models through `rounds` exactly as dflash_generate's drafting part does."""
    spec = ours.spec
    block, vocab = spec.block_size, spec.vocab_size or 512
    g = torch.Generator().manual_seed(seed)
    target = FakeTarget(vocab, spec.hidden_size, g).eval()
    head = target.as_head()
    total = CTX0 + sum(r or 0 for r in rounds) + block
    feats = torch.randn(1, total, spec.fc_input_width, generator=g)
    tokens = torch.randint(0, vocab, (1, total), generator=g)
    positions = torch.arange(total + block)[None]
    ref_cache, our_cache = zl._make_cache(ref.config), ours.new_cache()
    scale = float(zl._draft_value(ref.config, "input_embedding_scale", 1.0))
    start, prev, out = CTX0, 0, []
    for produced in rounds:
        if produced:
            prev, start = start, start + produced
        context = feats[:, prev:start]
        block_ids = torch.full((1, block), spec.mask_token_id, dtype=torch.long)
        block_ids[0, 0] = tokens[0, start]
        pos = positions[:, prev : start + block]
        with torch.inference_mode():
            noise = zl._raw_input_embeddings(target, block_ids, scale)
            ref_hidden = ref(target_hidden=context, noise_embedding=noise, position_ids=pos,
                             past_key_values=ref_cache, use_cache=True)
            zl._crop_to(ref_cache, start)
            draft_hidden = ref_hidden[:, 1 - block :, :]
            ref_logits = ref.compute_logits(draft_hidden, target.lm_head)
            if isinstance(ref, zl.DFlash2DraftModel):
                ref_tokens, ref_candidates, _ = ref.propose(draft_hidden, block_ids[:, 0], target.lm_head, 0.0)
            else:
                ref_tokens, ref_candidates = ref_logits.argmax(-1), None
        step = ours.draft(context, block_ids, pos, our_cache, head)
        assert our_cache.seq_length == start
        row = {"hidden": (step.hidden, ref_hidden), "logits": (step.logits, ref_logits),
               "tokens": (step.tokens, ref_tokens)}
        if ref_candidates is not None:
            _, candidates, _ = ours.propose(step.hidden[:, 1:], block_ids[:, 0], head)
            row["candidates"] = (candidates, ref_candidates)
        out.append(row)
    return out


def assert_rounds_equal(rows: list[dict]) -> None:
    for i, row in enumerate(rows):
        for key in ("hidden", "logits"):
            ours, ref = row[key]
            assert rel(ours, ref) <= RTOL, f"round {i}: {key} differ by {rel(ours, ref):.3g} relative"
        assert torch.equal(row["tokens"][0], row["tokens"][1]), f"round {i}: draft tokens differ"
        if "candidates" in row:  # top-k candidates, unordered
            ours, ref = row["candidates"]
            assert torch.equal(ours.sort(-1).values, ref.sort(-1).values)


# ---------------------------------------------------------------------------------------------
# Equivalence with z-lab's dflash package
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rounds", [(None,), ROUNDS_3], ids=["1-round", "3-rounds-cropped"])
def test_matches_reference(drafters: dict[str, Path], family: str, rounds: tuple[int | None, ...]) -> None:
    ours = load_drafter(drafters[family])
    spec = ours.spec
    if spec.sliding_window is not None:  # the window must actually cut something
        assert spec.sliding_window < CTX0 + spec.block_size
    assert_rounds_equal(run_both(reference_model(drafters[family]), ours, rounds))


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_weights_match_reference(drafters: dict[str, Path], family: str) -> None:
    """packed=True (dflash-parity's loading: matrices kept in the file's bf16/f16, unpacked per matmul)
    drafts what z-lab's float32 model drafts, within the same tolerances as the dense load."""
    ours = load_drafter(drafters[family], packed=True)
    assert any(isinstance(m, Linear) and m.packed for m in ours.modules())
    assert_rounds_equal(run_both(reference_model(drafters[family]), ours, ROUNDS_3))


def test_packed_target_head_matches_transformers(targets: dict[int, dict[str, Path]], monkeypatch) -> None:
    """A packed GGUF head: embedding rows exactly transformers' rows, logits those of its lm_head
    (projected in row blocks: the block size is cut so that the 512-token vocabulary takes several)."""
    from dflashkit.runtime import linear as runtime_linear  # the packed-weight knobs, read where Linear runs

    monkeypatch.setattr(runtime_linear, "PACKED_BLOCK_BYTES", 100 * 64 * 4)
    packed = load_target_head(targets[64]["gguf"], packed=True)
    runner = HFTarget(targets[64]["hf"]).head()
    assert packed.embed_tokens is None and packed.vocab_size == 512 and packed.hidden_size == 64
    ids = torch.tensor([[0, 5, 511, 5]])
    assert torch.equal(packed.embed(ids), F.embedding(ids, runner.embed_tokens))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(packed(x), x @ runner.lm_head.weight.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.BF16])
@pytest.mark.parametrize("n_rows", [1, 16])
def test_packed_tiles_multiply_as_one_dense_matmul(monkeypatch, qtype, n_rows: int) -> None:
    """A packed Linear unpacked tile by tile into its reused buffer (here 5 tiles, the last with the remainder)
    gives what one matmul gives on the whole weight as gguf-py dequantizes it, in and out of inference mode.

    Not bit for bit: the BLAS under both sides picks its kernel and its split of the k-sum by CPU and thread
    count, so the last bit is the machine's. The bound is the float-order one: each output element is a k-term
    f32 dot product, within k·eps·Σ|x||w| of the exact (f64) sum whatever the order. A wrong tile, a wrong row
    offset or a lost remainder is off by O(|x||w|), far outside it."""
    from dflashkit.runtime import linear as runtime_linear  # the packed-weight knobs, read where Linear runs

    rows, k = 5 * 32 + 13, 256
    monkeypatch.setattr(runtime_linear, "PACKED_TILE_BYTES", 32 * k * 4)
    assert len(runtime_linear.packed_tiles(rows, k)) == 5
    w = np.random.default_rng(3).standard_normal((rows, k)).astype(np.float32)
    raw = (gguf.quants.quantize(w, qtype) if qtype != gguf.GGMLQuantizationType.BF16
           else torch.from_numpy(w).to(torch.bfloat16).view(torch.uint8).numpy().reshape(rows, 2 * k))
    dense = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, qtype), np.float32))
    lin = Linear(k, rows)
    lin.set_packed(torch.from_numpy(np.ascontiguousarray(raw)), qtype)
    x = torch.randn(1, n_rows, k, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        inside = lin(x)
    exact = F.linear(x.double(), dense.double())
    bound = k * torch.finfo(torch.float32).eps * F.linear(x.double().abs(), dense.double().abs())
    for got in (inside, lin(x)):
        assert got.dtype == torch.float32 and got.shape == (1, n_rows, rows)
        assert bool(((got.double() - exact).abs() <= bound).all())
    assert not bool(((inside.double() - F.linear(x.double(), dense.double().roll(1, 0))).abs() <= bound).all())


@pytest.mark.parametrize("family", ["qwen3-b16", "dflash2"])
def test_matches_reference_from_pretrained(drafters: dict[str, Path], family: str) -> None:
    """z-lab's own loader (config.json as is; DFlash 2 codebooks renamed by its key_mapping)."""
    cls = zl.DFlash2DraftModel if family == "dflash2" else zl.DFlashDraftModel
    ref = cls.from_pretrained(drafters[family], dtype=torch.float32).eval()
    assert_rounds_equal(run_both(ref, load_drafter(drafters[family]), ROUNDS_3, seed=1))


def test_layer_semantics(drafters: dict[str, Path]) -> None:
    """Full layers non-causal, sliding layers causal + windowed, is_causal overriding both."""
    swa = load_drafter(drafters["qwen35-swa"])
    assert [(a.self_attn.causal, a.self_attn.window) for a in swa.layers] == [(True, 8), (True, 8), (False, None)]
    qwen = load_drafter(drafters["qwen3-b16"])
    assert all(not layer.self_attn.causal and layer.self_attn.window is None for layer in qwen.layers)
    optional = load_drafter(drafters["optional"])
    assert all(layer.self_attn.causal for layer in optional.layers)
    notes = " ".join(optional.load_info.notes)
    assert "partial rotary" in notes and "attention_value_scale" in notes


# ---------------------------------------------------------------------------------------------
# Loading: every form of a drafter gives the same model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family,dialect",
    [(f, "llama.cpp") for f in FAMILIES] + [("qwen3-b16", "luce"), ("gemma4", "luce"), ("qwen35-swa", "dflash-draft")],
)
def test_gguf_f32_equals_hf(
    drafters: dict[str, Path], targets: dict[int, dict[str, Path]], tmp_path: Path, family: str, dialect: str
) -> None:
    out = tmp_path / f"{family}.gguf"
    convert(drafters[family], out, outtype="f32", dialect=dialect, target=target_for(family, targets),
            progress=False, warn=lambda m: None)
    hf, gguf = load_drafter(drafters[family]), load_drafter(out)
    assert gguf.load_info.kind == "gguf" and gguf.load_info.dialect == dialect
    assert gguf.spec.target_layer_ids == hf.spec.target_layer_ids  # tap convention undone on read
    ref = reference_model(drafters[family])
    pairs = list(zip(run_both(ref, hf, ROUNDS_3), run_both(ref, gguf, ROUNDS_3)))
    causes = divergence_causes(hf.spec, gguf.spec, hf_config(drafters[family]))
    if causes:  # an audit row llama.cpp runs otherwise (the rows' own tests: tests/test_divergences_*.py)
        assert dialect == "llama.cpp" and family in ("gemma4", "optional"), causes  # softcap; rope dims, value scale
        assert not all(torch.equal(a["logits"][0], b["logits"][0]) for a, b in pairs)
        return
    if dialect == "llama.cpp" and family in CAUSALITY_LOST:
        # sliding layers without is_causal: z-lab runs them causal, llama.cpp's one flag (absent) none of them …
        assert not all(torch.equal(a["logits"][0], b["logits"][0]) for a, b in pairs)
        if gguf.spec.sliding_window < gguf.spec.block_size:  # (qwen35-swa: a window of 8 in a block of 16)
            return  # z-lab's bidirectional window hides block positions ahead too, llama.cpp's does not
        # … so the GGUF drafts as z-lab's own model of the checkpoint told is_causal: false
        said = tmp_path / "is_causal_false"
        shutil.copytree(drafters[family], said)
        config = json.loads((said / "config.json").read_text())
        (said / "config.json").write_text(json.dumps({**config, "is_causal": False}))
        assert_rounds_equal(run_both(reference_model(said), gguf, ROUNDS_3))
        return
    for a, b in pairs:
        assert torch.equal(a["logits"][0], b["logits"][0]) and torch.equal(a["hidden"][0], b["hidden"][0])


def test_quantized_gguf_is_close_not_equal(drafters: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "q8.gguf"
    convert(drafters["qwen3-b16"], out, outtype="q8_0", progress=False, warn=lambda m: None)
    q8 = load_drafter(out)
    assert "dequantized" in q8.load_info.matmul
    ref = reference_model(drafters["qwen3-b16"])
    for row in run_both(ref, q8, ROUNDS_3):
        err = rel(*row["logits"])
        assert 1e-7 < err < 0.05


def test_keep_quantized(drafters: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "q8.gguf"
    convert(drafters["qwen3-b16"], out, outtype="q8_0", progress=False, warn=lambda m: None)
    dense, kept = load_drafter(out), load_drafter(out, keep_quantized=True)
    assert kernels_available()  # dflashkit.runtime.kernels ships with the package
    assert kept.load_info.matmul == "quantized, dflashkit.runtime.kernels.qmatmul (reference path)"
    assert "dequantized" in dense.load_info.matmul
    assert any(isinstance(m, Linear) and m.is_quantized for m in kept.modules())
    ref = reference_model(drafters["qwen3-b16"])
    for a, b in zip(run_both(ref, dense, ROUNDS_3), run_both(ref, kept, ROUNDS_3)):
        assert rel(b["logits"][0], a["logits"][0]) < 1e-4


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 0.1), ("float16", 0.02)])
def test_half_dtypes(drafters: dict[str, Path], dtype: str, tol: float) -> None:
    path = drafters["gemma4"]  # softcap + embedding scale + SWA
    f32, half = load_drafter(path), load_drafter(path, dtype=dtype)
    assert half.fc.weight.dtype == resolve_dtype(dtype) and half.norm.weight.dtype == resolve_dtype(dtype)
    g = torch.Generator().manual_seed(0)
    spec = f32.spec
    target = FakeTarget(spec.vocab_size or 512, spec.hidden_size, g)
    ctx = torch.randn(1, CTX0, spec.fc_input_width, generator=g)
    ids = torch.full((1, spec.block_size), 4)
    pos = torch.arange(CTX0 + spec.block_size)[None]
    a = f32.draft(ctx, ids, pos, f32.new_cache(), target.as_head())
    head = target.as_head().to(resolve_dtype(dtype))
    b = half.draft(ctx.to(resolve_dtype(dtype)), ids, pos, half.new_cache(), head)
    assert b.logits.dtype == resolve_dtype(dtype)
    assert rel(b.logits.float(), a.logits) < tol


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["gemma4", "dflash2"])
def test_cuda_matches_cpu(drafters: dict[str, Path], family: str) -> None:
    cpu, gpu = load_drafter(drafters[family]), load_drafter(drafters[family], device="cuda")
    spec = cpu.spec
    g = torch.Generator().manual_seed(0)
    head = FakeTarget(spec.vocab_size or 512, spec.hidden_size, g).as_head()
    ctx = torch.randn(1, CTX0, spec.fc_input_width, generator=g)
    ids = torch.full((1, spec.block_size), spec.mask_token_id)
    pos = torch.arange(CTX0 + spec.block_size)[None]
    a = cpu.draft(ctx, ids, pos, cpu.new_cache(), head)
    b = gpu.draft(ctx.cuda(), ids.cuda(), pos.cuda(), gpu.new_cache(), head.to("cuda"))
    assert rel(b.logits.cpu(), a.logits) < 1e-4


def test_missing_tensor_is_one_line_error(drafters: dict[str, Path], tmp_path: Path) -> None:
    import make_drafters

    src = drafters["qwen3-b16"]
    with open_drafter(src) as f:
        tensors = {ref.name: ("F32", np.array(f.read_f32(c))) for c, ref in f.tensors.items()
                   if c != "layers.1.mlp.up_proj.weight"}
    out = tmp_path / "broken"
    out.mkdir()
    (out / "config.json").write_text((src / "config.json").read_text())
    make_drafters.write_safetensors(out / "model.safetensors", tensors)
    with pytest.raises(DFlashError, match="layers.1.mlp.up_proj.weight") as exc:
        load_drafter(out)
    assert "\n" not in str(exc.value)


def test_bad_device_and_dtype() -> None:
    with pytest.raises(UsageError, match="dtype"):
        resolve_dtype("int8")
    assert resolve_dtype("bf16") == torch.bfloat16 and resolve_dtype(torch.float16) == torch.float16
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA"):
            resolve_device("cuda")
    with pytest.raises(UsageError, match="unsupported device"):
        resolve_device("xla")


# ---------------------------------------------------------------------------------------------
# Cache, target head and target runner
# ---------------------------------------------------------------------------------------------


def test_cache_crop() -> None:
    cache = DraftCache(2)
    k = torch.arange(10.0).view(1, 1, 5, 2)
    for layer in range(2):
        full_k, _ = cache.update(layer, k, k)
        assert full_k.shape[-2] == 5
    full_k, _ = cache.update(0, k[..., :2, :], k[..., :2, :])
    assert full_k.shape[-2] == 7
    cache.crop(3)
    assert cache.seq_length == 3 and cache.keys[1].shape[-2] == 3
    assert torch.equal(cache.keys[0], k[..., :3, :])
    with pytest.raises(ValueError):
        cache.crop(-1)
    cache.reset()
    assert cache.seq_length == 0


def test_target_heads_agree(targets: dict[int, dict[str, Path]]) -> None:
    from_gguf = load_target_head(targets[64]["gguf"])
    from_hf = load_target_head(targets[64]["hf"])
    runner = HFTarget(targets[64]["hf"]).head()
    for head in (from_hf, runner):
        assert torch.equal(head.embed_tokens, from_gguf.embed_tokens)
        assert torch.equal(head.lm_head.weight, from_gguf.lm_head.weight)
    assert from_gguf.vocab_size == 512 and from_gguf.hidden_size == 64


def test_target_head_errors(tmp_path: Path, drafters: dict[str, Path]) -> None:
    with pytest.raises(DFlashError, match="no such file"):
        load_target_head(tmp_path / "nope.gguf")
    drafter = tmp_path / "drafter.gguf"
    convert(drafters["qwen3-b16"], drafter, outtype="f32", progress=False, warn=lambda m: None)
    with pytest.raises(DFlashError, match="token_embd"):
        load_target_head(drafter)


def test_tap_features_follow_extract_context_feature(targets: dict[int, dict[str, Path]]) -> None:
    """Offset 1 (hidden_states[0] is the embedding output); incremental features ≈ a full forward."""
    target = HFTarget(targets[64]["hf"])
    ids = target.encode("Hello world! The quick brown fox.")
    assert ids and all(isinstance(i, int) for i in ids)
    stream = target.stream(ids, [1, 8])
    feats = stream.features([1, 8], 0, len(ids) + 3)  # three generated tokens fed too
    full_ids = torch.tensor([stream.tokens[: len(ids) + 3]])
    with torch.inference_mode():
        out = target.model(full_ids, output_hidden_states=True, use_cache=False)
    want = extract_context_feature(out.hidden_states, [1, 8])
    want_zl = zl.extract_context_feature(out.hidden_states, [1, 8])
    assert torch.equal(want, want_zl)
    assert feats.shape == want.shape == (1, len(ids) + 3, 128)
    assert rel(feats, want) < 1e-5
    # greedy: each generated token is the argmax after its prefix
    assert stream.tokens[len(ids)] == int(out.logits[0, len(ids) - 1].argmax())
    with pytest.raises(DFlashError, match="wrong target"):
        target.stream(ids, [12])  # 12 layers: ids 0..11


def test_config_roundtrip_of_reference_helper(drafters: dict[str, Path]) -> None:
    """z-lab's reference, from config.json, agrees with our spec on taps, block size, mask, windows and softcap."""
    spec = load_drafter(drafters["gemma4"]).spec
    ref = reference_model(drafters["gemma4"])
    assert ref.target_layer_ids == list(spec.target_layer_ids) and ref.block_size == spec.block_size
    assert ref.mask_token_id == spec.mask_token_id
    assert [layer.self_attn.sliding_window for layer in ref.layers] == [16, 16, 16, 16, None]
    assert zl._draft_value(ref.config, "final_logit_softcapping") == 30.0  # z-lab reads it from config.json
