"""The runtime against vLLM ``speculators`` 0.9.0's own models (DFlash, DFlash 2, DSpark).

Each fixture checkpoint is written by speculators' classes (``*SpeculatorConfig`` + ``*DraftModel`` +
``save_pretrained``, weights re-drawn from a seeded generator, ``d2t``/``t2d`` set with
``load_vocab_mappings``); the reference is loaded back FROM THAT DIRECTORY by speculators' own
``from_pretrained`` (which also pulls the verifier's embeddings and head from the target directory the
config names). Its block logits come from its training forward, ``_backbone_forward``, with one anchor
(the loss mask selects it), plus — for DSpark — the lines of ``DSparkDraftModel.forward`` that add the
Markov bias and the confidence head, fed the tokens our runtime drafted as the block's "true" tokens
(teacher forcing = our chain's conditioning). ``_backbone_forward`` has no cache: each round is one
fresh pass over all context up to its anchor; ours runs the rounds through its cropped KV cache.

Equality: logits (draft-vocabulary rows) within 1e-5 relative (max |Δ| / max |ref|) in float32.

Part of the test extra: speculators 0.9.0 installed ``--no-deps`` with pydantic, pydantic-settings,
loguru (and the rest of ``pyproject``'s test extra).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from dflashkit.errors import DFlashError
from dflashkit.runtime import load_drafter, load_target_head
from dflashkit.runtime.config import runtime_config_from_hf

speculators = pytest.importorskip("speculators")
warnings.filterwarnings("ignore", module="transformers")

RTOL = 1e-5
HIDDEN, N_HEADS, N_KV, HEAD_DIM, INTER = 64, 4, 2, 16, 128
TARGET_VOCAB, MASK = 512, 500
TAPS = [1, 8]  # HF ids; speculators stores them + 1
DRAFT_VOCAB = 256
ANCHORS_3 = (20, 27, 33)  # anchor position of rounds 1..3 (rounds 2, 3 add 7 and 6 context tokens)
MEASURED: dict[str, float] = {}  # name → max relative difference (printed at the end with -s)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _reinit(module: torch.nn.Module, seed: int) -> None:
    """Seeded weights for every floating parameter: norms 1 + N(0, 0.1), the rest N(0, 0.05)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if not param.is_floating_point():
                continue
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            is_norm = param.ndim == 1 and "norm" in name
            param.copy_(1.0 + 0.1 * noise if is_norm else 0.05 * noise)


def write_speculators_checkpoint(kind: str, directory: Path, target_dir: Path, seed: int, *, draft_vocab: int,
                                 layer: dict[str, Any] | None = None, **fields: Any) -> Path:
    """A speculators ``kind`` drafter written by speculators' own classes (save_pretrained)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import Qwen3Config

    if kind == "dflash":
        from speculators.models.dflash import DFlashDraftModel as Model, DFlashSpeculatorConfig as Config
    elif kind == "dflash2":
        from speculators.models.dflash2 import DFlash2DraftModel as Model, DFlash2SpeculatorConfig as Config
    else:
        from speculators.models.dspark import DSparkDraftModel as Model, DSparkSpeculatorConfig as Config
    layer_kwargs: dict[str, Any] = dict(
        hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=N_HEADS, num_key_value_heads=N_KV,
        head_dim=HEAD_DIM, intermediate_size=INTER, vocab_size=TARGET_VOCAB, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    layer_kwargs.update(layer or {})
    block_size = fields.pop("block_size", 8)
    probe = Config(transformer_layer_config=Qwen3Config(**layer_kwargs), draft_vocab_size=draft_vocab, **fields)
    config = Config(
        transformer_layer_config=Qwen3Config(**layer_kwargs), draft_vocab_size=draft_vocab, block_size=block_size,
        aux_hidden_state_layer_ids=[i + 1 for i in TAPS], mask_token_id=MASK, target_hidden_size=HIDDEN,
        speculators_config=SpeculatorsConfig(
            algorithm=kind,
            proposal_methods=[GreedyTokenProposalConfig(
                speculative_tokens=block_size if probe.sample_from_anchor else block_size - 1)],
            default_proposal_method="greedy", verifier=VerifierConfig.from_pretrained(str(target_dir)),
        ),
        **fields,
    )
    torch.manual_seed(seed)
    model = Model(config)
    _reinit(model, seed)
    if draft_vocab != TARGET_VOCAB:
        ids = torch.randperm(TARGET_VOCAB, generator=torch.Generator().manual_seed(seed + 1))[:draft_vocab].sort().values
        t2d = torch.zeros(TARGET_VOCAB, dtype=torch.bool)
        t2d[ids] = True
        model.load_vocab_mappings(t2d, ids - torch.arange(draft_vocab))  # d2t as offsets, as speculators stores it
    model.save_pretrained(str(directory))
    return directory


_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "rope_theta": 1000000.0,
         "beta_fast": 32.0, "beta_slow": 1.0}
_SLIDING = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6, "use_sliding_window": True}

#: name → (kind, draft vocab, layer overrides, config fields)
FIXTURES: dict[str, tuple[str, int, dict[str, Any], dict[str, Any]]] = {
    # reduced draft vocab (own lm_head + d2t), a causal sliding layer, YaRN
    "dflash": ("dflash", DRAFT_VOCAB, {**_SLIDING, "rope_parameters": _YARN}, {}),
    # full vocabulary (the verifier's head), bidirectional sliding block (its default), gelu
    "dflash2": ("dflash2", TARGET_VOCAB, {**_SLIDING, "hidden_act": "gelu_pytorch_tanh"},
                {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}),
    # Markov + confidence heads, d2t, sample_from_anchor true (its default), linear rope scaling
    "dspark": ("dspark", DRAFT_VOCAB, {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                           "rope_theta": 1000000.0}}, {"markov_rank": 16}),
    # sample_from_anchor false (slot 0 = anchor), full vocabulary, confidence head without the Markov input
    "dspark-bonus-anchor": ("dspark", TARGET_VOCAB, {}, {"markov_rank": 16, "sample_from_anchor": False,
                                                          "confidence_head_with_markov": False}),
}


@pytest.fixture(scope="module")
def zoo(targets: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("speculators")
    target = targets[64]["hf"]
    return {name: write_speculators_checkpoint(kind, root / name, target, 7 + i, draft_vocab=vocab, layer=layer,
                                               **fields)
            for i, (name, (kind, vocab, layer, fields)) in enumerate(FIXTURES.items())}


def reference_model(directory: Path) -> Any:
    """speculators' own model, from the checkpoint directory, with eager attention (a float mask)."""
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(directory))
    config.transformer_layer_config._attn_implementation = "eager"
    # float32 throughout: a bf16 checkpoint's weights upcast exactly, and the verifier's embeddings / head
    # (pulled from the target directory) are not rounded to the checkpoint's dtype on the way in
    model = SpeculatorModel.from_pretrained(str(directory), config=config, dtype=torch.float32)
    return model.float().eval()


def reference_block(ref: Any, feats: torch.Tensor, anchor_pos: int, anchor: int, drafted: list[int],
                    gen: torch.Generator) -> dict[str, torch.Tensor]:
    """speculators' block logits (and DSpark confidence) for one anchor at ``anchor_pos``: context =
    every position before it; the block's later tokens (teacher forcing) = our drafted tokens."""
    block = ref.block_size
    total = anchor_pos + block + 1  # the anchor must lie before the last `block` positions
    ids = torch.randint(0, TARGET_VOCAB, (1, total), generator=gen)
    ids[0, anchor_pos] = anchor
    ids[0, anchor_pos + 1 : anchor_pos + block] = torch.tensor(drafted[: block - 1])
    loss_mask = torch.zeros(1, total, dtype=torch.long)
    loss_mask[0, anchor_pos] = 1
    with torch.no_grad():
        hidden, logits, _, _, block_indices = ref._backbone_forward(
            feats[:, :total], ids, loss_mask, torch.randn(1, total, HIDDEN, generator=gen),
            torch.zeros(1, total, dtype=torch.long), max_anchors=1)
        out = {"hidden": hidden[0], "logits": logits[0]}
        if type(ref).__name__ == "DSparkDraftModel":  # DSparkDraftModel.forward's head lines, num_blocks = 1
            block_tokens = ids[0, block_indices].view(1, block)
            prev = block_tokens if ref.config.sample_from_anchor else torch.cat(
                [block_tokens[:, :1], block_tokens[:, :-1]], dim=1)
            out.update(dspark_heads(ref.markov_head, ref.confidence_head, logits, hidden, prev,
                                    with_markov=ref.config.confidence_head_with_markov))
        if type(ref).__name__ == "DFlash2DraftModel":
            pred = ref._predecessor_ids(ids, block_indices).reshape(1, -1)
            cands, scores = ref.candidate_selector.select(logits, hidden, pred)
            out["path"] = cands[0].gather(-1, scores[0].argmax(-1, keepdim=True))[:, 0]
    return out


def dspark_heads(markov_head: Any, confidence_head: Any, logits: torch.Tensor, hidden: torch.Tensor,
                 prev: torch.Tensor, *, with_markov: bool) -> dict[str, torch.Tensor]:
    """``DSparkDraftModel.forward``'s head lines for one block (num_blocks = 1): the Markov bias of each slot's
    previous token (``prev`` [1, block]) added to the block logits, and the confidence of each slot."""
    block = prev.shape[1]
    hidden_blocks = hidden.view(1, block, -1)
    prev_emb = markov_head.prev_embeddings(prev)
    out = {"logits": (logits.view(1, block, -1) + markov_head.block_bias(
        prev_token_ids=prev, hidden_states=hidden_blocks, prev_emb=prev_emb)).view(block, -1)}
    if confidence_head is not None:
        feats_c = torch.cat([hidden_blocks, prev_emb], -1) if with_markov else hidden_blocks
        out["confidence"] = torch.sigmoid(confidence_head(feats_c).reshape(block))
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def run_rounds(name: str, directory: Path, target_dir: Path, anchors: tuple[int, ...],
               reference_dir: Path | None = None) -> float:
    ours = load_drafter(directory)
    head = load_target_head(target_dir)
    ref = reference_model(reference_dir or directory)
    gen = torch.Generator().manual_seed(11)
    feats = torch.randn(1, anchors[-1] + 16, len(TAPS) * HIDDEN, generator=gen)
    block = ours.block_size
    first = ours.first_draft_slot
    cache = ours.new_cache()
    worst, done = 0.0, 0
    for anchor_pos in anchors:
        anchor = int(torch.randint(0, MASK, (1,), generator=gen))
        block_ids = torch.full((1, block), MASK, dtype=torch.long)
        block_ids[0, 0] = anchor
        positions = torch.arange(done, anchor_pos + block)[None]
        step = ours.draft(feats[:, done:anchor_pos], block_ids, positions, cache, head)
        done = anchor_pos
        assert cache.seq_length == anchor_pos  # cropped back to the context, as dflash_generate does
        drafted = step.tokens[0].tolist()
        expect = reference_block(ref, feats, anchor_pos, anchor, drafted, gen)
        # the draft-vocabulary rows, predicting slots only
        r = rel(step.draft_logits[0], expect["logits"][first:])
        r_hidden = rel(step.hidden[0], expect["hidden"])
        worst = max(worst, r, r_hidden)
        assert r < RTOL and r_hidden < RTOL, (name, anchor_pos, r, r_hidden)
        # tokens: greedy over the target vocabulary after d2t
        d2t = ref.d2t + torch.arange(ref.d2t.numel()) if ref.use_draft_vocab else None
        ref_ids = expect["logits"][first:].argmax(-1)
        if d2t is not None:
            ref_ids = d2t[ref_ids]
            # every target id outside d2t is -inf, the others carry their draft row
            assert torch.isinf(step.logits[0]).sum() == step.logits.shape[1] * (TARGET_VOCAB - d2t.numel())
            assert torch.equal(step.logits[0][:, d2t], step.draft_logits[0])
        if "path" in expect:
            assert drafted == expect["path"][first:].tolist()
        else:
            assert drafted == ref_ids.tolist()
        if "confidence" in expect:
            rc = rel(step.confidence[0], expect["confidence"][first:])
            worst = max(worst, rc)
            assert rc < RTOL, (name, "confidence", rc)
        else:
            assert step.confidence is None
    MEASURED[f"{name} x{len(anchors)}"] = worst
    return worst


@pytest.mark.parametrize("name", list(FIXTURES))
@pytest.mark.parametrize("anchors", [ANCHORS_3[:1], ANCHORS_3], ids=["1-round", "3-rounds"])
def test_logits_equal_speculators(name: str, anchors: tuple[int, ...], zoo: dict[str, Path], targets: dict) -> None:
    worst = run_rounds(name, zoo[name], targets[64]["hf"], anchors)
    print(f"\n{name} {len(anchors)} round(s): max relative difference {worst:.3g}")


def test_runtime_config_reads_speculators_layout(zoo: dict[str, Path]) -> None:
    cfg = runtime_config_from_hf(json.loads((zoo["dspark"] / "config.json").read_text()))
    assert (cfg.family, cfg.layout, cfg.label) == ("dspark", "speculators", "speculators DSpark")
    assert cfg.target_layer_ids == tuple(TAPS)  # aux_hidden_state_layer_ids − 1
    assert (cfg.sample_from_anchor, cfg.draft_tokens, cfg.own_lm_head, cfg.draft_vocab_size) == (True, 8, True, 256)
    assert (cfg.markov_rank, cfg.markov_head_type, cfg.has_confidence_head) == (16, "vanilla", True)
    assert cfg.rope_scaling == (("type", "linear"), ("factor", 2.0))
    d = runtime_config_from_hf(json.loads((zoo["dflash"] / "config.json").read_text()))
    assert (d.sample_from_anchor, d.draft_tokens, d.sliding_window_pattern, d.sliding_window) == (False, 7, (True, False), 6)
    assert d.window_from_anchor and not d.sliding_window_non_causal
    d2 = runtime_config_from_hf(json.loads((zoo["dflash2"] / "config.json").read_text()))
    assert (d2.family, d2.hidden_act, d2.sliding_window_non_causal, d2.selector_top_k) == ("dflash2", "gelu_pytorch_tanh", True, 4)
    assert load_drafter(zoo["dspark"]).load_info.family_name == "speculators DSpark"


@pytest.mark.parametrize("edit, message", [
    # the families' wording (dflashkit.families reads every layout; the runtime adds only its own fields)
    (lambda c: c.pop("transformer_layer_config"), "'transformer_layer_config' is missing — a speculators checkpoint"),
    (lambda c: c.update(aux_hidden_state_layer_ids=[0, 9]), "counts the embedding output as 0"),
    (lambda c: c.update(markov_head_type="gated"), "unsupported markov_head_type 'gated'"),
    (lambda c: c.update(speculators_model_type="mlp_speculator"),
     "speculators_model_type 'mlp_speculator' is not a drafter family dflashkit reads"),
])
def test_bad_speculators_configs(zoo: dict[str, Path], edit: Any, message: str) -> None:
    config = json.loads((zoo["dspark"] / "config.json").read_text())
    edit(config)
    with pytest.raises(DFlashError, match=message):
        runtime_config_from_hf(config, "x/config.json")


def test_d2t_out_of_range_or_duplicated_is_refused(zoo: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file
    import shutil

    # the family's checks (the converter's, worded as llama.cpp's converter words them)
    for label, change, message in (("range", lambda d: d.__setitem__(0, 10_000), "d2t target ids out of range"),
                                   ("dup", lambda d: d.__setitem__(1, d[0] - 1), "d2t contains duplicate target ids")):
        out = tmp_path / label
        shutil.copytree(zoo["dspark"], out)
        tensors = load_file(str(out / "model.safetensors"))
        change(tensors["d2t"])
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(DFlashError, match=message):
            load_drafter(out)


def test_greedy_acceptance_reproduces_the_target(zoo: dict[str, Path], targets: dict) -> None:
    """At temperature 0, dflash-accept's output equals the target's own greedy output for every family
    (sample_from_anchor drafters verify block_size tokens a round, the others block_size − 1)."""
    from dflashkit.accept import Prompt, run_acceptance
    from dflashkit.runtime import HFTarget

    runner = HFTarget(targets[64]["hf"])
    prompts = [Prompt("a", messages=(("user", "The quick brown fox"),)), Prompt("b", text="def f(x): return")]
    result = run_acceptance(runner, [zoo[n] for n in FIXTURES], prompts, max_new_tokens=20, warmup=False,
                            ignore_eos=True)
    for i, ids in enumerate(result.prompt_ids):
        with torch.inference_mode():
            greedy = runner.model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                                           eos_token_id=None)[0, len(ids):].tolist()
        for d in result.drafters:
            assert d.runs[i].output_ids == greedy, d.path
    widths = {Path(d.path).name: d.block_size for d in result.drafters}
    assert widths == {"dflash": 8, "dflash2": 8, "dspark": 9, "dspark-bonus-anchor": 8}  # anchor + drafts
    assert max(a for d in result.drafters if Path(d.path).name == "dspark" for a in d.accepted) <= 8
    families = [row["family"] for row in json.loads(result.report().to_json())["sections"][0]["rows"]]
    assert families == ["speculators DFlash", "speculators DFlash 2", "speculators DSpark", "speculators DSpark"]


def test_sampled_acceptance_runs_every_family(zoo: dict[str, Path], targets: dict) -> None:
    """Temperature 1: rejection sampling over the d2t-scattered distributions (−inf rows have p = 0)."""
    from dflashkit.accept import Prompt, run_acceptance

    result = run_acceptance(targets[64]["hf"], [zoo[n] for n in FIXTURES], [Prompt("b", text="def f(x): return")],
                            max_new_tokens=16, temperature=1.0, warmup=False, ignore_eos=True, seed=3)
    for d in result.drafters:
        (run,) = d.runs
        assert len(run.output_ids) == 16 and all(0 <= t < TARGET_VOCAB for t in run.output_ids)
        assert all(0 <= a <= d.block_size - 1 for a in run.accepted)
        assert len(run.output_ids) == 1 + sum(a + 1 for a in run.accepted)


def test_parity_runs_on_d2t_and_anchor_drafters(zoo: dict[str, Path], targets: dict) -> None:
    """dflash-parity on a sample_from_anchor + d2t drafter: all 8 slots compared on the draft rows."""
    from dflashkit.parity import run_parity

    r = run_parity(zoo["dspark"], zoo["dspark"], target=targets[64]["hf"], rounds=2, weights=False)
    assert [p for p, _ in r.per_position] == list(range(8))
    assert r.overall is not None and r.overall.top1 == 1.0 and r.overall.kl_max == 0.0
    summary = json.loads(r.report().to_json())["summary"]
    assert summary["family"] == "speculators DSpark" and summary["verification"].startswith("chain verify")
    # drafters predicting from different block slots: draft token j against draft token j, and said
    other = run_parity(zoo["dspark"], zoo["dspark-bonus-anchor"], target=targets[64]["hf"], weights=False)
    assert [p for p, _ in other.per_position] == list(range(7))
    assert other.causes == ["the drafters predict from different block slots (reference from slot 0, candidate from "
                            "slot 1): draft token j is compared with draft token j"]


def as_specforge(src: Path, out: Path, architecture: str) -> Path:
    """The same DSpark weights in the SpecForge / DeepSpec layout llama.cpp's DSparkModel reads: a z-lab-style
    config (hparams top level, taps as HF ids in dflash_config, DSpark keys top level), no t2d."""
    from safetensors.torch import load_file, save_file

    spec_cfg = json.loads((src / "config.json").read_text())
    config = dict(spec_cfg["transformer_layer_config"])
    config.update(
        architectures=[architecture], dflash_config={"target_layer_ids": TAPS, "mask_token_id": MASK, "block_size": 8},
        markov_rank=spec_cfg["markov_rank"], markov_head_type="vanilla",
        enable_confidence_head=spec_cfg["enable_confidence_head"],
        confidence_head_with_markov=spec_cfg["confidence_head_with_markov"],
        sample_from_anchor=spec_cfg["sample_from_anchor"],
    )
    if spec_cfg["draft_vocab_size"] != TARGET_VOCAB:
        config["draft_vocab_size"] = spec_cfg["draft_vocab_size"]
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if k != "t2d"}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("name, architecture", [("dspark", "Qwen3DSparkModel"),
                                                ("dspark-bonus-anchor", "DSparkSpeculator")])
def test_specforge_layout_equals_speculators(zoo: dict[str, Path], targets: dict, tmp_path: Path, name: str,
                                             architecture: str) -> None:
    """SpecForge/DeepSpec DSpark has no installable package: the same weights in its layout must draft what
    speculators' model drafts from its own checkpoint."""
    specforge = as_specforge(zoo[name], tmp_path / "specforge", architecture)
    worst = run_rounds(f"specforge {name}", specforge, targets[64]["hf"], ANCHORS_3, reference_dir=zoo[name])
    model = load_drafter(specforge)
    assert (model.spec.layout, model.load_info.family_name) == ("specforge", "SpecForge DSpark")
    print(f"\nSpecForge layout of {name}, 3 rounds: max relative difference {worst:.3g}")


@pytest.mark.parametrize("architecture, message", [
    ("DeepseekV4DSparkModel", "DeepseekV4DSparkModel is a DeepSeek-V4 backbone"),
])
def test_unsupported_dspark_backbones_are_refused_by_name(tmp_path: Path, architecture: str, message: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture], "hidden_size": 64}))
    with pytest.raises(DFlashError, match=message):
        load_drafter(tmp_path)


@pytest.mark.parametrize("layout", ["speculators", "specforge"])
def test_dflash_convert_dspark_gguf_equals_speculators(zoo: dict[str, Path], targets: dict, tmp_path: Path,
                                                        layout: str) -> None:
    """dflash-convert's GGUF of the DSpark checkpoint (the llama.cpp dialect maps the Markov / confidence heads
    and d2t to canonical ids) drafts in the runtime what speculators' own model drafts from the HF checkpoint.
    Needs no llama.cpp source (the oracle test above checks the same with llama.cpp's converter)."""
    from dflashkit.converters.convert import convert

    src = zoo["dspark"] if layout == "speculators" else as_specforge(zoo["dspark"], tmp_path / "sf", "Qwen3DSparkModel")
    gguf_path = tmp_path / "dspark.gguf"
    convert(src, gguf_path, outtype="f32", target=targets[64]["hf"], progress=False, warn=lambda _: None)
    worst = run_rounds(f"dflash-convert gguf {layout}", gguf_path, targets[64]["hf"], ANCHORS_3,
                       reference_dir=zoo["dspark"])
    model = load_drafter(gguf_path)
    assert (model.spec.family, model.spec.sample_from_anchor, model.spec.markov_rank) == ("dspark", True, 16)
    assert model.load_info.family_name == "DSpark (llama.cpp GGUF)"
    assert not any("ignored" in n for n in model.load_info.notes), model.load_info.notes
    print(f"\ndflash-convert GGUF of the {layout} DSpark, 3 rounds: max relative difference {worst:.3g}")


@pytest.mark.parametrize("layout", ["speculators", "specforge"])
def test_llama_cpp_dspark_gguf_equals_speculators(zoo: dict[str, Path], targets: dict, tmp_path: Path,
                                                   layout: str) -> None:
    """The GGUF llama.cpp's own converter (conversion/qwen.py DSparkModel) writes from the DSpark checkpoint
    — Markov + confidence heads, d2t (absolute I64), output, sample_from_anchor, linear rope scaling —
    drafts in our runtime what speculators' model drafts from the HF checkpoint. Skips without llama.cpp's
    source (DFLASHKIT_LLAMA_CPP_SRC, see tests/llama_cpp_oracle.py)."""
    from llama_cpp_oracle import run_oracle

    src = zoo["dspark"] if layout == "speculators" else as_specforge(zoo["dspark"], tmp_path / "sf", "Qwen3DSparkModel")
    gguf_path = run_oracle(src, tmp_path / "dspark.gguf", outtype="f32", target_dir=targets[64]["hf"])
    worst = run_rounds(f"gguf {layout}", gguf_path, targets[64]["hf"], ANCHORS_3, reference_dir=zoo["dspark"])
    model = load_drafter(gguf_path)
    assert (model.spec.family, model.spec.sample_from_anchor, model.spec.markov_rank) == ("dspark", True, 16)
    assert model.spec.rope_scaling == (("type", "linear"), ("factor", 2.0))
    assert model.load_info.family_name == "DSpark (llama.cpp GGUF)"
    assert not any("ignored" in n for n in model.load_info.notes), model.load_info.notes
    print(f"\nllama.cpp GGUF of the {layout} DSpark, 3 rounds: max relative difference {worst:.3g}")
    # and at temperature 0 dflash-accept with the GGUF reproduces the target's greedy output
    from dflashkit.accept import Prompt, run_acceptance
    from dflashkit.runtime import HFTarget

    runner = HFTarget(targets[64]["hf"])
    result = run_acceptance(runner, [gguf_path], [Prompt("b", text="def f(x): return")], max_new_tokens=20,
                            warmup=False, ignore_eos=True)
    ids = result.prompt_ids[0]
    with torch.inference_mode():
        greedy = runner.model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                                       eos_token_id=None)[0, len(ids):].tolist()
    assert result.drafters[0].runs[0].output_ids == greedy


ZOO_DFLASH = ["spec-dflash", "spec-dflash-fullvocab", "spec-dflash2"]


@pytest.fixture(scope="module")
def zoo_dflash(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """fixtures/make_zoo.py's speculators DFlash / DFlash 2 checkpoints (written by speculators' classes)."""
    import make_zoo

    return make_zoo.make_zoo(tmp_path_factory.mktemp("zoo-dflash"), ZOO_DFLASH)


@pytest.mark.parametrize("name", ZOO_DFLASH)
def test_dflash_convert_speculators_dflash_gguf_equals_speculators(zoo_dflash, tmp_path: Path, name: str) -> None:
    """dflash-convert's GGUF of a speculators DFlash / DFlash 2 checkpoint (d2t + own output for the reduced
    vocabulary, dflash.sample_from_anchor false) drafts in the runtime what speculators' own model drafts from
    the HF checkpoint, 3 rounds, float32."""
    from dflashkit.converters.convert import convert

    target, made = zoo_dflash
    gguf_path = tmp_path / f"{name}.gguf"
    convert(made[name], gguf_path, outtype="f32", target=target, progress=False, warn=lambda _: None)
    worst = run_rounds(f"dflash-convert gguf {name}", gguf_path, target, ANCHORS_3, reference_dir=made[name])
    model = load_drafter(gguf_path)
    assert (model.load_info.kind, model.spec.sample_from_anchor, model.draft_tokens) == ("gguf", False, 7)
    assert (model.d2t is not None) == (name == "spec-dflash")
    assert not any("ignored" in n for n in model.load_info.notes), model.load_info.notes
    print(f"\ndflash-convert GGUF of {name}, 3 rounds: max relative difference {worst:.3g}")
