"""The Gemma-4 DSpark runtime (dflashkit/runtime/gemma4_dspark.py) against transformers' own Gemma-4 modules.

No package runs a Gemma-4 DSpark drafter, so the reference is composed from the real pieces, built from the
checkpoint directory (its config.json → ``Gemma4TextConfig``; its safetensors loaded into the modules by
their transformers names, strict):

- the backbone: transformers 5.15's ``Gemma4TextDecoderLayer`` (sandwich norms, ``layer_scalar``, GeGLU MLP)
  with its ``Gemma4TextAttention`` (``attention_k_eq_v``: values = ``v_norm`` of the key projection, scale
  1.0), ``Gemma4RMSNorm`` for ``hidden_norm`` / ``norm``, ``Gemma4TextRotaryEmbedding`` (proportional RoPE),
  ``Gemma4TextScaledWordEmbedding`` (√hidden) over the target's embedding table;
- the DFlash wiring as llama.cpp's ``src/models/dflash.cpp`` runs it: the target taps through ``fc`` →
  ``hidden_norm`` give the context, whose keys/values are projected without the layer's input norm and
  concatenated before the block's; the block attends to all of it (non-causal). Here the attention module
  runs on ``[context; block]`` with no mask and the block's rows are kept — every block query sees every key;
- the heads: speculators 0.9.0's ``MarkovHead`` / ``ConfidenceHead`` with ``DSparkDraftModel.forward``'s
  lines (`test_runtime_speculators.dspark_heads`), teacher-forced with the tokens our chain drafted.

Each reference round is one fresh pass over all context up to its anchor; ours runs the rounds through its
cropped KV cache. Equality: draft logits, final hidden states and confidences within 1e-5 relative
(max |Δ| / max |ref|) in float32, for the HF checkpoint and the GGUF dflash-convert writes (f32 and bf16;
byte-identical to llama.cpp's converter, tests/test_zoo_dspark.py), and — with DFLASHKIT_LLAMA_CPP_SRC —
the GGUF llama.cpp's own converter writes.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import make_zoo
from dflashkit.converters.convert import convert
from dflashkit.runtime import load_drafter, load_target_head
from dflashkit.runtime.config import runtime_config_from_hf

pytest.importorskip("speculators.models.dspark")
gemma4 = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
from test_runtime_speculators import dspark_heads, rel  # noqa: E402  (needs speculators)

warnings.filterwarnings("ignore", module="transformers")

RTOL = 1e-5
ANCHORS_3 = (20, 27, 33)  # anchor position of rounds 1..3 (rounds 2, 3 add 7 and 6 context tokens)
NAME = "gemma4-dspark"
QUIET = dict(progress=False, warn=lambda _: None)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The HF fixture, its target, and dflash-convert's f32 / bf16 GGUFs of it."""
    root = tmp_path_factory.mktemp("gemma4")
    target, dirs = make_zoo.make_zoo(root / "zoo", [NAME])
    out = {"target": target, "hf": dirs[NAME]}
    for outtype in ("f32", "bf16"):
        out[f"gguf-{outtype}"] = root / f"{NAME}-{outtype}.gguf"
        convert(dirs[NAME], out[f"gguf-{outtype}"], outtype=outtype, target=target, **QUIET)
    return out


class _WithContext(nn.Module):
    """transformers' ``Gemma4TextAttention`` over ``[context; block]`` (no mask), the block's rows returned:
    what the layer's own forward sees as its attention when the context's keys/values join the block's."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention
        self.context: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor, position_embeddings: Any, attention_mask: Any = None,
                **_: Any) -> tuple[torch.Tensor, Any]:
        q_len = hidden_states.shape[1]
        out, weights = self.attention(torch.cat([self.context, hidden_states], dim=1), position_embeddings, None, {})
        return out[:, -q_len:], weights


class Reference(nn.Module):
    """The Gemma-4 DSpark drafter assembled from transformers' Gemma-4 modules and speculators' heads."""

    def __init__(self, directory: Path, target_dir: Path) -> None:
        super().__init__()
        from safetensors.torch import load_file
        from speculators.models.dspark.model_definitions import ConfidenceHead, MarkovHead
        from transformers import Gemma4TextConfig

        config = json.loads((directory / "config.json").read_text())
        # the drafter's layers have no per-layer inputs, KV sharing or MoE (Gemma4TextConfig defaults differ)
        self.config = Gemma4TextConfig(
            **{k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype")},
            hidden_size_per_layer_input=0, num_kv_shared_layers=0, enable_moe_block=False,
            attn_implementation="eager")
        c = self.config
        weights = {k: v.float() for k, v in load_file(str(directory / "model.safetensors")).items()}

        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}

        taps = len(config["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(taps * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = gemma4.Gemma4RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layers = nn.ModuleList(gemma4.Gemma4TextDecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = gemma4.Gemma4RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.rotary = gemma4.Gemma4TextRotaryEmbedding(c)
        self.markov_head = MarkovHead(verifier_vocab_size=c.vocab_size, draft_vocab_size=c.vocab_size,
                                      markov_rank=config["markov_rank"], hidden_size=c.hidden_size)
        self.confidence_head = ConfidenceHead(c.hidden_size + config["markov_rank"])
        for name in ("fc", "hidden_norm", "norm", "lm_head", "markov_head", "confidence_head"):
            getattr(self, name).load_state_dict(part(f"{name}."), strict=True)
        for i, layer in enumerate(self.layers):
            layer.load_state_dict(part(f"layers.{i}."), strict=True)
            layer.self_attn = _WithContext(layer.self_attn)
        target = load_file(str(target_dir / "model.safetensors"))
        table = target["model.embed_tokens.weight"].float()
        self.embed = gemma4.Gemma4TextScaledWordEmbedding(table.shape[0], table.shape[1], None,
                                                          embed_scale=c.hidden_size**0.5)
        self.embed.load_state_dict({"weight": table}, strict=True)
        self.eval()

    @torch.no_grad()
    def block(self, feats: torch.Tensor, anchor_pos: int, block_ids: torch.Tensor,
              drafted: list[int]) -> dict[str, torch.Tensor]:
        """One round with every position before ``anchor_pos`` as context; the block's later tokens for the
        Markov chain (teacher forcing) are ``drafted``."""
        x = self.embed(block_ids)
        context = self.hidden_norm(self.fc(feats[:, :anchor_pos]))
        positions = torch.arange(anchor_pos + block_ids.shape[1])[None]
        cos_sin = self.rotary(x, positions, "full_attention")
        for layer in self.layers:
            layer.self_attn.context = context
            x = layer(x, shared_kv_states={}, position_embeddings=cos_sin, attention_mask=None)
        hidden = self.norm(x)[0]
        prev = torch.tensor([[int(block_ids[0, 0]), *drafted[:-1]]])  # sample_from_anchor: slot k after token k
        out = dspark_heads(self.markov_head, self.confidence_head, self.lm_head(hidden), hidden, prev,
                           with_markov=True)
        return {"hidden": hidden, **out}


def run_rounds(path: Path, made: dict[str, Path], anchors: tuple[int, ...]) -> float:
    ours = load_drafter(path, ggml_activations=False)  # the graph against transformers' layers (rounding: elsewhere)
    head = load_target_head(made["target"])
    ref = Reference(made["hf"], made["target"])
    gen = torch.Generator().manual_seed(11)
    feats = torch.randn(1, anchors[-1] + 16, ref.fc.in_features, generator=gen)
    block = ours.block_size
    assert (ours.first_draft_slot, ours.draft_tokens) == (0, block)  # sample_from_anchor: every slot predicts
    cache = ours.new_cache()
    worst, done = 0.0, 0
    for anchor_pos in anchors:
        block_ids = torch.full((1, block), make_zoo.MASK_TOKEN_ID, dtype=torch.long)
        block_ids[0, 0] = int(torch.randint(0, make_zoo.MASK_TOKEN_ID, (1,), generator=gen))
        step = ours.draft(feats[:, done:anchor_pos], block_ids, torch.arange(done, anchor_pos + block)[None], cache,
                          head)
        done = anchor_pos
        assert cache.seq_length == anchor_pos
        drafted = step.tokens[0].tolist()
        expect = ref.block(feats, anchor_pos, block_ids, drafted)
        diffs = {"logits": rel(step.draft_logits[0], expect["logits"]), "hidden": rel(step.hidden[0], expect["hidden"]),
                 "confidence": rel(step.confidence[0], expect["confidence"])}
        worst = max(worst, *diffs.values())
        assert all(d < RTOL for d in diffs.values()), (path.name, anchor_pos, diffs)
        assert torch.equal(step.logits, step.draft_logits)  # full vocabulary: no d2t
        assert drafted == expect["logits"].argmax(-1).tolist()  # the greedy chain the reference conditions on
    return worst


@pytest.mark.parametrize("form", ["hf", "gguf-f32", "gguf-bf16"])
@pytest.mark.parametrize("anchors", [ANCHORS_3[:1], ANCHORS_3], ids=["1-round", "3-rounds"])
def test_logits_equal_transformers_gemma4(form: str, anchors: tuple[int, ...], made: dict[str, Path]) -> None:
    worst = run_rounds(made[form], made, anchors)
    print(f"\n{NAME} {form}, {len(anchors)} round(s): max relative difference {worst:.3g}")


def test_llama_cpp_converter_gguf_equals_transformers_gemma4(made: dict[str, Path], oracle_build: str,
                                                             tmp_path: Path) -> None:
    """The GGUF llama.cpp's own converter (conversion/gemma.py Gemma4DSparkModel) writes runs to the same
    logits. Skips without llama.cpp's source (DFLASHKIT_LLAMA_CPP_SRC, see tests/llama_cpp_oracle.py)."""
    from llama_cpp_oracle import run_oracle

    gguf_path = run_oracle(made["hf"], tmp_path / "llama-cpp.gguf", outtype="f32", target_dir=made["target"],
                           build=oracle_build)
    worst = run_rounds(gguf_path, made, ANCHORS_3)
    print(f"\n{NAME} llama.cpp converter GGUF, 3 rounds: max relative difference {worst:.3g}")


def test_loads_as_gemma4_dspark(made: dict[str, Path]) -> None:
    """Both forms load as the Gemma-4 DSpark family (own full-vocabulary head, Markov + confidence heads,
    k_eq_v: no v_proj), nothing in the file ignored."""
    for form, label in (("hf", "Gemma-4 DSpark"), ("gguf-f32", "Gemma-4 DSpark (llama.cpp GGUF)")):
        model = load_drafter(made[form])
        assert model.load_info.family_name == label
        assert model.load_info.notes == []
        spec = model.spec
        assert (spec.family, spec.own_lm_head, spec.draft_vocab_size, spec.markov_rank) == ("dspark", True, None, 16)
        assert (spec.has_confidence_head, spec.confidence_head_with_markov, spec.sample_from_anchor) == (True, True, True)
        assert (spec.head_dim, spec.n_kv_heads, spec.attention_scale, spec.embedding_scale) == (32, 1, 1.0, 8.0)
        assert not hasattr(model.layers[0].self_attn, "v_proj")
        # proportional RoPE, partial_rotary_factor 0.25 of 32 dims: 4 rotated pairs, 12 kept (factor 1e30)
        assert torch.equal(model.rotary_emb.weight, torch.tensor([1.0] * 4 + [1e30] * 12))
    # the HF config alone, read by runtime_config_from_hf, says the same
    cfg = runtime_config_from_hf(json.loads((made["hf"] / "config.json").read_text()))
    assert (cfg.label, cfg.family, cfg.own_lm_head, cfg.confidence_head_with_markov, cfg.draft_tokens) == (
        "Gemma-4 DSpark", "dspark", True, True, 16)


def test_greedy_acceptance_reproduces_the_target(made: dict[str, Path]) -> None:
    """At temperature 0, dflash-accept's output with the Gemma-4 DSpark (HF and both GGUFs) equals the
    target's own greedy output; a round verifies the anchor + 16 drafted tokens (sample_from_anchor)."""
    from dflashkit.accept import Prompt, run_acceptance
    from dflashkit.runtime import HFTarget

    runner = HFTarget(made["target"])
    prompts = [Prompt("a", messages=(("user", "The quick brown fox"),)), Prompt("b", text="def f(x): return")]
    paths = [made["hf"], made["gguf-f32"], made["gguf-bf16"]]
    result = run_acceptance(runner, paths, prompts, max_new_tokens=24, warmup=False, ignore_eos=True)
    for i, ids in enumerate(result.prompt_ids):
        with torch.inference_mode():
            greedy = runner.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                           eos_token_id=None)[0, len(ids):].tolist()
        for d in result.drafters:
            assert d.runs[i].output_ids == greedy, d.path
    assert [d.block_size for d in result.drafters] == [17, 17, 17]
    families = [row["family"] for row in json.loads(result.report().to_json())["sections"][0]["rows"]]
    assert families == ["Gemma-4 DSpark", "Gemma-4 DSpark (llama.cpp GGUF)", "Gemma-4 DSpark (llama.cpp GGUF)"]


_CANDIDATE = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \(\s*([-\d.]+)\)")
_ROUND_END = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)")


def llama_cpp_rounds(stderr: str) -> list[tuple[dict[int, list[tuple[int, float]]], int]]:
    """llama-speculative-simple's verbose log → per round: (block slot → its top candidates (id, p)
    best first, the target's token that closed the round)."""
    rounds, current = [], {}
    for line in stderr.splitlines():
        if m := _CANDIDATE.search(line):
            current.setdefault(int(m[2]), []).append((int(m[3]), float(m[4])))
        elif m := _ROUND_END.search(line):
            rounds.append((current, int(m[3])))
            current = {}
    return rounds


def test_llama_cpp_drafts_what_the_runtime_drafts(made: dict[str, Path], tmp_path: Path) -> None:
    """llama.cpp (llama-speculative-simple, draft-dspark, temperature 0) running dflash-convert's f32 GGUF
    of the fixture drafts, round by round, the tokens dflashkit's runtime drafts from the same GGUF: its
    first round drafts from the last prompt token (ours starts after the prefill's token), so its round
    r + 1 is our round r — the target's tokens that close the rounds say the two runs are aligned. A slot
    may differ only where llama.cpp's two best candidates tie to its printed precision (0.001; its target
    features come from ggml, ours from transformers) and our token is its second; the slot's successor
    then conditions on another token, so that round is compared no further. Skips without
    DFLASHKIT_LLAMA_CPP_BIN."""
    import os
    import subprocess

    import make_target
    from dflashkit.runtime import HFTarget
    from dflashkit.runtime.speculative import speculative_generate

    binary = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_BIN", "/nonexistent")) / "llama-speculative-simple"
    if not binary.exists():
        pytest.skip("set DFLASHKIT_LLAMA_CPP_BIN to a llama.cpp build with llama-speculative-simple")
    target_gguf = make_target.make_gguf_target(tmp_path / "target.gguf", made["target"])
    r = subprocess.run([str(binary), "-m", str(target_gguf), "-md", str(made["gguf-f32"]), "--spec-type", "draft-dspark",
                        "--spec-draft-n-max", "16", "-p", "hello world", "-n", "24", "--temp", "0", "-t", "1", "-c", "256",
                        "-lv", "5"], capture_output=True, text=True, errors="replace", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = llama_cpp_rounds(r.stderr)[1:]  # their round 1 drafts from the last prompt token
    assert len(theirs) >= 10, r.stderr[-2000:]

    runner = HFTarget(made["target"])
    model = load_drafter(made["gguf-f32"])
    ours: list[list[int]] = []
    draft = model.draft

    def recording(*args: Any, **kwargs: Any) -> Any:
        step = draft(*args, **kwargs)
        ours.append(step.tokens[0].tolist())
        return step

    model.draft = recording  # type: ignore[method-assign]
    prompt = runner.tokenizer("hello world")["input_ids"]
    result = speculative_generate(model, runner, prompt, max_new_tokens=64, stop_token_ids=())
    compared = exact_rounds = 0
    for i, (slots, closing) in enumerate(theirs):
        # the anchor of our round i is the token that closed their round i + 1 (aligned runs)
        assert result.output_ids[i + 1] == closing, (i, result.output_ids[: i + 2], closing)
        exact = True
        for slot, token in enumerate(ours[i]):
            if slot not in slots:  # a log line llama.cpp's logger lost
                continue
            (best, p_best), *rest = slots[slot]
            compared += 1
            if token != best:
                assert rest and rest[0][0] == token and p_best - rest[0][1] <= 0.001 + 1e-9, (i, slot, token, slots[slot])
                exact = False
                break
        exact_rounds += exact
    assert compared >= 10 * 8 and exact_rounds >= len(theirs) // 2, (compared, exact_rounds, len(theirs))
    print(f"\nllama.cpp vs dflashkit drafts: {len(theirs)} rounds, {compared} slots compared, "
          f"{exact_rounds} rounds equal in every slot")
