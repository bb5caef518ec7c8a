"""A target made costlier than its drafter the way real pairs are, with the same tokens: the trained target with
extra decoder layers appended whose output projections (``o_proj``, ``down_proj``) are zero.

A zero output projection adds exact zeros to the residual stream, so every hidden state the drafter taps (layers
1 and 2) and every logit is the original target's — the same greedy tokens, the same τ — while each target forward
does the extra layers' attention and MLP work. On the trained pair the target costs about what the drafter costs;
with 28 extra layers (32 in all) the target dominates the round, as an 8 B–27 B target does beside its drafter.
The figures made with it are labelled as such wherever they appear (benchmarks/SERVING.md, RELEASE.md).

    python benchmarks/costly_target.py OUT_DIR [--extra-layers 28]   # an HF folder; convert it as any target
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINED_TARGET = ROOT / "fixtures" / "trained" / "target"


def make_costly_target(out: Path, extra_layers: int = 28, src: Path = TRAINED_TARGET) -> Path:
    """``src`` with ``extra_layers`` zero-output layers appended, saved as an HF folder at ``out`` (tokenizer
    copied); checks that the greedy tokens of a few prompts are the original's before it returns."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src)
    n = config.num_hidden_layers
    config.num_hidden_layers = n + extra_layers
    config.layer_types = list(config.layer_types) + [config.layer_types[-1]] * extra_layers
    config.max_window_layers = n + extra_layers
    torch.manual_seed(0)
    original = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    missing, unexpected = model.load_state_dict(original.state_dict(), strict=False)
    assert not unexpected and all(".layers." in k and int(k.split(".layers.")[1].split(".")[0]) >= n for k in missing)
    with torch.no_grad():
        for layer in model.model.layers[n:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    with torch.no_grad():  # the same tokens: greedy continuations of a few prompts, token for token
        for ids in ([1, 2, 3, 4], [50, 60, 70], [400, 12, 9, 300, 5]):
            x = torch.tensor([ids])
            a = original.generate(x, max_new_tokens=24, do_sample=False)
            b = model.generate(x, max_new_tokens=24, do_sample=False)
            assert torch.equal(a, b), (ids, a.tolist(), b.tolist())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--extra-layers", type=int, default=28)
    args = ap.parse_args()
    make_costly_target(args.out, args.extra_layers)
    print(f"{args.out}: the trained target with {args.extra_layers} zero-output layers appended (same tokens)")


if __name__ == "__main__":
    main()
