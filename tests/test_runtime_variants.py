"""Shared building blocks for the zoo's z-lab variants, each against its reference:

- YaRN / linear RoPE scaling and gelu MLPs: z-lab checkpoints written by ``dflash`` 0.1.0's own class
  (``save_pretrained``), loaded back by z-lab's ``from_pretrained``; logits within 1e-5 relative, 3 rounds;
- interleaved RoPE (``rope_is_neox_style: false``): our q/k reordering + NeoX RoPE equals transformers'
  interleaved RoPE (GLM's ``apply_rotary_pos_emb``), and the HF layout run interleaved gives the same
  logits as the NeoX-permuted weights (the layout llama.cpp's converter writes) run NeoX;
- attention sinks: equal to transformers' gpt-oss ``eager_attention_forward``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from dflash import model as zl
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from dflashkit.runtime import load_drafter
from dflashkit.errors import DFlashError
from dflashkit.runtime.config import RuntimeConfig, runtime_config_from_hf
from dflashkit.runtime.dflash import RotaryEmbedding, apply_rotary, neox_order, sink_attention
from test_runtime import ROUNDS_3, assert_rounds_equal, rel, run_both

warnings.filterwarnings("ignore", module="transformers")
HIDDEN, N_HEADS, N_KV, HEAD_DIM = 64, 4, 2, 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write_zlab(directory: Path, seed: int, **overrides: Any) -> Path:
    """A z-lab DFlashDraftModel written by dflash 0.1.0's class, seeded weights."""
    fields: dict[str, Any] = dict(
        architectures=["DFlashDraftModel"], hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV, head_dim=HEAD_DIM, intermediate_size=128, vocab_size=512,
        max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    extra = {k: overrides.pop(k) for k in list(overrides) if k == "rope_is_neox_style"}
    fields.update(overrides)
    config = Qwen3Config(**fields)
    config.block_size = 8
    config.num_target_layers = 12
    config.dflash_config = {"mask_token_id": 500, "target_layer_ids": [1, 8]}
    for key, value in extra.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = zl.DFlashDraftModel(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if p.ndim == 1 and "norm" in name else 0.05 * noise)
    model.save_pretrained(str(directory))
    return directory


VARIANTS = {
    "yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                 "rope_theta": 1000000.0, "beta_fast": 32.0, "beta_slow": 1.0}},
    "yarn-attention-factor": {"rope_parameters": {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.3,
                                                  "original_max_position_embeddings": 512, "rope_theta": 10000.0}},
    "linear": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}},
    "gelu": {"hidden_act": "gelu"},
    "gelu-tanh": {"hidden_act": "gelu_pytorch_tanh"},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_zlab_variants_match_dflash(variant: str, tmp_path: Path) -> None:
    d = write_zlab(tmp_path / variant, 3, **VARIANTS[variant])
    ours = load_drafter(d)
    assert isinstance(ours.spec, RuntimeConfig)  # the variant was read, not dropped
    ref = zl.DFlashDraftModel.from_pretrained(d, dtype=torch.float32).eval()
    assert_rounds_equal(run_both(ref, ours, ROUNDS_3, seed=2))
    # and the variant matters: the plain model differs
    plain = load_drafter(write_zlab(tmp_path / "plain", 3))
    rows_plain = run_both(ref, plain, (None,), seed=2)
    assert rel(*rows_plain[0]["logits"]) > 1e-3


def test_plain_zlab_checkpoint_keeps_its_drafter_spec(tmp_path: Path) -> None:
    """No variant: the spec stays the `DrafterSpec` io reads (GGUF and HF forms compare equal)."""
    assert type(load_drafter(write_zlab(tmp_path / "plain", 3)).spec).__name__ == "DrafterSpec"


def test_interleaved_rotation_equals_transformers_interleaved_rope() -> None:
    from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as interleaved

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, N_HEADS, 5, HEAD_DIM, generator=gen)
    k = torch.randn(1, N_KV, 5, HEAD_DIM, generator=gen)
    cos, sin = RotaryEmbedding(HEAD_DIM, 10000.0)(torch.arange(5)[None], torch.float32)
    ref_q, ref_k = interleaved(q, k, cos, sin)
    order = neox_order(HEAD_DIM)
    ours_q, ours_k = apply_rotary(q[..., order], k[..., order], cos, sin)
    assert rel(ours_q, ref_q[..., order]) < 1e-6 and rel(ours_k, ref_k[..., order]) < 1e-6
    assert rel(apply_rotary(q, k, cos, sin)[0], ref_q) > 1e-2  # NeoX RoPE on the raw head is different


def test_interleaved_checkpoint_same_logits_as_its_neox_permutation(tmp_path: Path) -> None:
    """HF layout (rope_is_neox_style false) run interleaved == NeoX-permuted weights run NeoX."""
    hf = write_zlab(tmp_path / "interleaved", 5, rope_is_neox_style=False)
    cfg = runtime_config_from_hf(json.loads((hf / "config.json").read_text()))
    assert cfg.rope_interleaved
    permuted = tmp_path / "permuted"
    permuted.mkdir()
    tensors = load_file(str(hf / "model.safetensors"))
    order = neox_order(HEAD_DIM)
    for name, t in list(tensors.items()):
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # rows per head, even dims then odd
            tensors[name] = t.view(-1, HEAD_DIM, t.shape[-1])[:, order].reshape(t.shape).contiguous()
        elif name.endswith(("q_norm.weight", "k_norm.weight")):
            tensors[name] = t[order].contiguous()
    save_file(tensors, str(permuted / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((hf / "config.json").read_text())
    config["rope_is_neox_style"] = True
    (permuted / "config.json").write_text(json.dumps(config))
    a, b = load_drafter(hf), load_drafter(permuted)
    assert a.layers[0].self_attn.rope_order is not None and b.layers[0].self_attn.rope_order is None
    ref = zl.DFlashDraftModel.from_pretrained(permuted, dtype=torch.float32).eval()  # z-lab runs NeoX only
    rows_a, rows_b = run_both(ref, a, ROUNDS_3, seed=4), run_both(ref, b, ROUNDS_3, seed=4)
    assert_rounds_equal(rows_b)
    for ra, rb in zip(rows_a, rows_b):
        assert rel(ra["logits"][0], rb["logits"][0]) < 1e-5
        assert torch.equal(ra["tokens"][0], rb["tokens"][0])


@pytest.mark.parametrize("masked", [False, True])
def test_sink_attention_equals_gpt_oss_eager(masked: bool) -> None:
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, N_HEADS, 6, HEAD_DIM, generator=gen)
    k = torch.randn(1, N_KV, 10, HEAD_DIM, generator=gen)
    v = torch.randn(1, N_KV, 10, HEAD_DIM, generator=gen)
    sinks = torch.randn(N_HEADS, generator=gen) * 2
    mask = None
    float_mask = None
    if masked:
        mask = (torch.arange(10)[None, :] <= torch.arange(4, 10)[:, None])[None, None]
        float_mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=N_HEADS // N_KV, training=False)
    ref, _ = eager_attention_forward(module, q, k, v, float_mask, HEAD_DIM**-0.5)
    rep = lambda x: x.repeat_interleave(N_HEADS // N_KV, dim=1)  # noqa: E731
    ours = sink_attention(q, rep(k), rep(v), mask, sinks, HEAD_DIM**-0.5).transpose(1, 2)
    assert rel(ours, ref) < 1e-6
    no_sink = torch.nn.functional.scaled_dot_product_attention(q, rep(k), rep(v), attn_mask=mask).transpose(1, 2)
    assert rel(no_sink, ref) > 1e-3


def test_llama3_rope_runs_from_the_gguf_but_not_from_the_hf_checkpoint(tmp_path: Path) -> None:
    """llama.cpp's converter writes nothing for llama3 / dynamic RoPE, so the GGUF runs plain RoPE (as llama.cpp
    does); the HF checkpoint's own model rotates with the scaling, which the runtime does not compute: refused
    (exit 1) rather than silently run with plain RoPE."""
    from click.testing import CliRunner

    from dflashkit.cli import parity_command
    from dflashkit.converters.convert import convert

    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 1024, "rope_theta": 1000000.0}
    hf = write_zlab(tmp_path / "llama3", 6, rope_parameters=llama3)
    gguf_path = tmp_path / "llama3.gguf"
    convert(hf, gguf_path, outtype="f32", progress=False, warn=lambda _: None)
    assert load_drafter(gguf_path).spec.rope_scaling is None  # plain RoPE, as llama.cpp runs the file
    message = (f"{hf / 'config.json'}: rope type 'llama3' is not run by dflashkit's runtime from the HF checkpoint "
               "(one of default, linear, yarn); llama.cpp ignores it too — run the converted GGUF to see what "
               "llama.cpp computes")
    with pytest.raises(DFlashError) as err:
        load_drafter(hf)
    assert str(err.value) == message
    res = CliRunner().invoke(parity_command, [str(hf), str(gguf_path)])
    assert res.exit_code == 1 and res.output.strip().splitlines()[-1] == f"error: {message}"
