"""The audit's rope rows (`dflashkit.divergences.rope`, docs/causality.md): partial rotary, YaRN's extras and the
attention value scale, each planted in the trained checkpoint, converted, named in one warning (``--strict``
refuses), run from the GGUF by llama.cpp's arithmetic (checked against ggml's formulas written out here) and the
loss measured by ``dflash-parity CHECKPOINT FILE.gguf`` with the row named as the likely cause."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dflashkit.cli import convert_command, parity_command
from dflashkit.runtime import load_drafter
from dflashkit.runtime.blocks import apply_rotary

ROOT = Path(__file__).resolve().parents[1]
TRAINED, LONG = ROOT / "fixtures" / "trained", ROOT / "fixtures" / "trained-long"
TARGET = TRAINED / "target"
THETA = 1e6  # the trained drafter's rope_theta

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _plant(dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    shutil.copytree(TRAINED / "drafter", dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def _convert(src: Path, out: Path, *extra: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(convert_command, [str(src), str(out), "--target", str(TARGET), *extra])


def _said_and_refused(planted: Path, tmp_path: Path, line: str) -> Path:
    """Converted with exactly ``line`` as its one warning; ``--strict`` refuses and writes nothing."""
    out = tmp_path / "llama.gguf"
    res = _convert(planted, out)
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [f"warning: {planted / 'config.json'}: {line} (docs/causality.md)"]
    strict = _convert(planted, tmp_path / "strict.gguf", "--strict")
    assert strict.exit_code == 1 and not (tmp_path / "strict.gguf").exists()
    return out


def _parity_names(planted: Path, gguf_path: Path, line: str) -> None:
    """dflash-parity fails the pair, names ``line`` as the likely cause and measures the loss."""
    res = CliRunner().invoke(parity_command, [str(planted), str(gguf_path), "--target", str(TARGET), "--rounds", "3",
                                              "--skip-weights", "--format", "json"])
    report = json.loads(res.stdout)
    assert res.exit_code == 1 and f"likely cause: {line}" in report["status"]
    summary = report["summary"]
    assert summary["top1"] < 0.99 and summary["kl"][0] > 0.01


def _ggml_neox(x: np.ndarray, pos: np.ndarray, n_rot: int, inv_freq: np.ndarray, mscale: float = 1.0) -> np.ndarray:
    """ggml's NeoX rope of ``x`` [..., len, head_dim]: pair (i, i + n_rot/2) turned by pos·inv_freq[i], each
    multiplied by mscale; dims n_rot.. pass through."""
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :half]
    c, s = np.cos(ang) * mscale, np.sin(ang) * mscale
    x0, x1 = x[..., :half].astype(np.float64), x[..., half:n_rot].astype(np.float64)
    out[..., :half] = x0 * c - x1 * s
    out[..., half:n_rot] = x0 * s + x1 * c
    return out


def _rope_both(model: Any, n: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(q, k, q roped, k roped) through the model's rotary tables and `apply_rotary`, in float32."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 4, 64, generator=g), torch.randn(1, 2, n, 64, generator=g)
    cos, sin = model.rotary_emb(torch.arange(n)[None] + 100, torch.float32)
    qr, kr = apply_rotary(q, k, cos, sin)
    return q.numpy(), k.numpy(), qr.numpy(), kr.numpy()


# -- a. partial_rotary_factor ----------------------------------------------------------------------------------

PARTIAL = ("partial_rotary_factor: the reference (z-lab's Qwen3 attention) rotates all 64 dimensions of the head — "
           "its Qwen3 rotary embedding ignores the factor, and dflashkit's runtime runs the checkpoint so; llama.cpp "
           "rotates only the first 32 of the 64 (rope.dimension_count, NeoX pairs within them) and passes the other 32 "
           "through")


@pytest.mark.parametrize("where", ["top", "rope_parameters"])
def test_partial_rotary_is_said_run_as_llama_cpp_and_its_loss_measured(where: str, tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        (config if where == "top" else config["rope_parameters"])["partial_rotary_factor"] = 0.5

    planted = _plant(tmp_path / "partial", edit)
    out = _said_and_refused(planted, tmp_path, PARTIAL)
    llama, hf = load_drafter(out, ggml_activations=False), load_drafter(planted)  # the scale alone, not rounding
    assert llama.spec.llama_cpp_rules and llama.spec.rope_dimension_count == 32
    assert any("first 32 of 64 dims rotate" in n for n in llama.load_info.notes)
    pos = np.arange(10) + 100
    q, k, qr, kr = _rope_both(llama)
    inv32 = THETA ** (-np.arange(0, 32, 2) / 32)  # ggml: theta_scale = base^(-2/n_dims)
    np.testing.assert_allclose(kr, _ggml_neox(k, pos, 32, inv32), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(qr, _ggml_neox(q, pos[-4:], 32, inv32), rtol=1e-4, atol=1e-4)
    assert np.array_equal(kr[..., 32:], k[..., 32:])
    # the checkpoint: every one of the 64 dims rotates, at the full head's frequencies
    q, k, qr, kr = _rope_both(hf)
    np.testing.assert_allclose(kr, _ggml_neox(k, pos, 64, THETA ** (-np.arange(0, 64, 2) / 64)), rtol=1e-4, atol=1e-4)
    if where == "top":  # one parity run is enough (slow)
        _parity_names(planted, out, PARTIAL)


# -- b. YaRN extras -------------------------------------------------------------------------------------------

YARN = {"rope_theta": THETA, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
YARN_LINE = ("rope_scaling (yarn): the reference (transformers' YaRN) rotates with beta_fast 8, beta_slow 2, "
             "attention_factor 1.5; llama.cpp reads no rope.scaling.yarn_* key for dflash and rotates with its "
             "defaults, beta_fast 32, beta_slow 1, attention_factor 1.13863")


def _ggml_yarn(n_dims: int, factor: float, n_ctx_orig: int, beta_fast: float = 32, beta_slow: float = 1,
               ext_factor: float = 1.0) -> tuple[np.ndarray, float]:
    """(per-pair frequency, cos/sin factor) as ggml's ``rope_yarn`` turns them, with llama-context.cpp's attn_factor
    (mscale(factor) / (1 + 0.1 ln factor): ggml multiplies the second factor back)."""
    def corr(rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (rot * 2 * math.pi)) / (2 * math.log(THETA))

    low, high = max(0.0, math.floor(corr(beta_fast))), min(n_dims - 1.0, math.ceil(corr(beta_slow)))
    i = np.arange(n_dims // 2)
    ramp_mix = (1 - np.clip((i - low) / max(0.001, high - low), 0, 1)) * ext_factor
    extrap = THETA ** (-2 * i / n_dims)
    interp = extrap / factor
    mscale_f = 0.1 * math.log(factor) + 1
    attn_factor = mscale_f / (1 + 0.1 * math.log(factor))
    return interp * (1 - ramp_mix) + extrap * ramp_mix, attn_factor * (1 + 0.1 * math.log(factor))


def test_yarn_extras_are_said_run_with_llama_cpps_defaults_and_their_loss_measured(tmp_path: Path) -> None:
    extras = {"beta_fast": 8.0, "beta_slow": 2.0, "attention_factor": 1.5}
    planted = _plant(tmp_path / "yarn", lambda c: c.update(rope_parameters={**YARN, **extras}))
    out = _said_and_refused(planted, tmp_path, YARN_LINE)
    llama = load_drafter(out)
    assert llama.spec.llama_cpp_rules and dict(llama.spec.rope_scaling)["beta_fast"] == 8.0  # written, not read
    inv, scale = llama.rotary_emb.inv_freq()
    want_inv, want_scale = _ggml_yarn(64, 4.0, 1024)
    np.testing.assert_allclose(inv.numpy(), want_inv, rtol=1e-5)
    assert scale == pytest.approx(want_scale, rel=1e-6)
    pos = np.arange(10) + 100
    q, k, qr, kr = _rope_both(llama)
    np.testing.assert_allclose(kr, _ggml_neox(k, pos, 64, want_inv, want_scale), rtol=1e-4, atol=1e-4)
    # the checkpoint rotates with its own values (transformers' YaRN: the ramp from betas 8 / 2, cos/sin × 1.5)
    ref_inv, ref_scale = load_drafter(planted).rotary_emb.inv_freq()
    assert ref_scale == 1.5 and not np.allclose(ref_inv.numpy(), want_inv)
    np.testing.assert_allclose(ref_inv.numpy(), _ggml_yarn(64, 4.0, 1024, 8.0, 2.0)[0], rtol=1e-5)
    _parity_names(planted, out, YARN_LINE)


@pytest.mark.parametrize("extras", [{}, {"beta_fast": 32, "beta_slow": 1}, {"extrapolation_factor": 0.5}])
def test_yarn_as_llama_cpp_runs_it_is_not_said(extras: dict[str, float], tmp_path: Path) -> None:
    """Default betas agree; ``extrapolation_factor`` is read by neither transformers' YaRN nor llama.cpp (1)."""
    planted = _plant(tmp_path / "yarn", lambda c: c.update(rope_parameters={**YARN, **extras}))
    out = tmp_path / "yarn.gguf"
    res = _convert(planted, out, "--strict")
    assert res.exit_code == 0 and res.stderr == "", res.output
    ref, llama = load_drafter(planted).rotary_emb.inv_freq(), load_drafter(out).rotary_emb.inv_freq()
    assert torch.equal(ref[0], llama[0]) and ref[1] == llama[1]


# -- c. attention_value_scale ---------------------------------------------------------------------------------

VALUE_SCALE = ("attention_value_scale: the reference (z-lab) does not read it — the attention output is not scaled; "
               "llama.cpp multiplies each layer's attention output (after o_proj) by 0.5")


def test_attention_value_scale_is_said_applied_as_llama_cpp_and_its_loss_measured(tmp_path: Path) -> None:
    planted = _plant(tmp_path / "value-scale", lambda c: c.update(attention_value_scale=0.5))
    out = _said_and_refused(planted, tmp_path, VALUE_SCALE)
    llama, hf = load_drafter(out, ggml_activations=False), load_drafter(planted)  # the scale alone, not rounding
    assert llama.spec.llama_cpp_rules and llama.spec.attention_value_scale == 0.5
    assert any("scales each attention output" in n for n in llama.load_info.notes)
    assert any("is ignored" in n for n in hf.load_info.notes)
    a, b = llama.layers[0].self_attn, hf.layers[0].self_attn
    assert torch.equal(a.o_proj.weight, b.o_proj.weight)
    g = torch.Generator().manual_seed(0)
    x, ctx = torch.randn(1, 4, 256, generator=g), torch.randn(1, 6, 256, generator=g)
    cos, sin = hf.rotary_emb(torch.arange(10)[None], torch.float32)
    with torch.no_grad():
        # ggml_scale(build_attn(... wo ...), s): s × the unscaled output, before DFlash 2's conv and the residual
        assert torch.equal(a(x, ctx, cos, sin, None), b(x, ctx, cos, sin, None) * 0.5)
    _parity_names(planted, out, VALUE_SCALE)


def test_no_rope_row_fires_on_the_committed_pairs() -> None:
    from dflashkit.divergences import divergences, hf_config
    from dflashkit.divergences.rope import RULES
    from dflashkit.drafters import open_drafter

    ids = {r.id for r in RULES}
    for path in (TRAINED / "drafter", TRAINED / "drafter-speculators", LONG / "drafter"):
        with open_drafter(path) as d:
            assert not [x for x in divergences(d.spec, hf_config(path)) if x.rule.id in ids], path
