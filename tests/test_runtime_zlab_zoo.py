"""z-lab MiMo (``mask_embedding.pt``) and self-contained (own ``embed_tokens`` / ``lm_head``) drafters in the runtime.

z-lab's ``dflash`` 0.1.0 has no such drafter (its model takes the noise embedding and the head from the
target), so llama.cpp's loader (``src/models/dflash.cpp``) is the specification, for the HF checkpoint and the
GGUF alike: the block is looked up in the drafter file's ``token_embd`` when it has one, else in the target's;
logits come from the drafter's ``output`` when it has one, else the target's. For MiMo, llama.cpp's converter
writes ``token_embd`` = the target's embeddings with the mask token's row replaced by ``mask_embedding.pt``'s
vector, and ``output`` = the target's head.

The reference here: z-lab's own ``DFlashDraftModel`` (``from_pretrained`` on the fixture directory, written by
its own class, fixtures/make_zoo.py) for the backbone, fed the embedding and head that rule gives, built in this
file from the checkpoint files (safetensors + ``torch.load(weights_only=True)``), never from dflashkit. Runs:
the HF directory, dflash-convert's GGUF and — with DFLASHKIT_LLAMA_CPP_SRC — llama.cpp's own converter's GGUF.
MiMo's attention sinks have no z-lab reference: the fixture without them is compared with z-lab, the one
with them HF vs GGUF forms (the sink attention itself equals gpt-oss's, tests/test_runtime_variants.py).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

import make_zoo
from llama_cpp_oracle import llama_cpp_src, run_oracle
from test_runtime import rel

from dflashkit.converters.convert import convert
from dflashkit.runtime import load_drafter, load_target_head

zl = pytest.importorskip("dflash.model")
warnings.filterwarnings("ignore", module="transformers")

RTOL = 1e-5
ANCHORS = (20, 27, 33)  # anchor position of rounds 1..3
MEASURED: dict[str, float] = {}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("zlab-zoo")
    target, made = make_zoo.make_zoo(root, ["zlab-mimo", "zlab-self-contained"])
    # MiMo without its sinks (z-lab's class has no sink attention): the mask embedding alone
    plain = root / "zlab-mimo-no-sinks"
    shutil.copytree(made["zlab-mimo"], plain)
    tensors = {k: v for k, v in load_file(str(plain / "model.safetensors")).items() if "sink" not in k}
    save_file(tensors, str(plain / "model.safetensors"), metadata={"format": "pt"})
    made["zlab-mimo-no-sinks"] = plain
    return target, made


def llama_cpp_tables(drafter: Path, target: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding table, output head) that llama.cpp's DFlash graph uses for this checkpoint, float32."""
    from safetensors.torch import load_file

    own = load_file(str(drafter / "model.safetensors"))
    tgt = load_file(str(target / "model.safetensors"))
    embed = own.get("embed_tokens.weight", tgt["model.embed_tokens.weight"]).clone()
    head = own.get("lm_head.weight", tgt["lm_head.weight"])
    mask_file = drafter / "mask_embedding.pt"
    if mask_file.is_file():  # the converter writes the row in the embedding table's dtype
        mask = torch.load(mask_file, map_location="cpu", weights_only=True)
        embed[int(mask["mask_token_id"])] = mask["embedding"].to(embed.dtype)
    return embed.float(), head.float()


def reference_rounds(drafter: Path, target: Path, feats: torch.Tensor, anchors: list[int]) -> list[torch.Tensor]:
    """z-lab's DFlashDraftModel with llama.cpp's embedding and head: block logits (slots 1..) per round."""
    ref = zl.DFlashDraftModel.from_pretrained(str(drafter), dtype=torch.float32).eval()
    embed, head = llama_cpp_tables(drafter, target)
    lm_head = torch.nn.Linear(head.shape[1], head.shape[0], bias=False)
    lm_head.weight.data = head
    cache, done, out = zl._make_cache(ref.config), 0, []
    block = ref.block_size
    for anchor_pos, anchor in anchors:
        block_ids = torch.full((1, block), ref.mask_token_id, dtype=torch.long)
        block_ids[0, 0] = anchor
        with torch.inference_mode():
            hidden = ref(target_hidden=feats[:, done:anchor_pos], noise_embedding=torch.nn.functional.embedding(block_ids, embed),
                         position_ids=torch.arange(done, anchor_pos + block)[None], past_key_values=cache, use_cache=True)
            zl._crop_to(cache, anchor_pos)
            out.append(ref.compute_logits(hidden[:, 1:], lm_head)[0])
        done = anchor_pos
    return out


def our_rounds(path: Path, target: Path, feats: torch.Tensor, anchors: list[tuple[int, int]]) -> list[torch.Tensor]:
    model, head = load_drafter(path), load_target_head(target)
    cache, done, out = model.new_cache(), 0, []
    for anchor_pos, anchor in anchors:
        block_ids = torch.full((1, model.block_size), model.mask_token_id, dtype=torch.long)
        block_ids[0, 0] = anchor
        step = model.draft(feats[:, done:anchor_pos], block_ids, torch.arange(done, anchor_pos + model.block_size)[None],
                           cache, head)
        out.append(step.logits[0])
        done = anchor_pos
    return out


def inputs(seed: int = 5) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, ANCHORS[-1] + 16, len(make_zoo.TAPS) * make_zoo.HIDDEN, generator=gen)
    return feats, [(pos, int(torch.randint(0, make_zoo.MASK_TOKEN_ID, (1,), generator=gen))) for pos in ANCHORS]


def forms(zoo, name: str, tmp_path: Path) -> dict[str, Path]:
    """The HF directory, dflash-convert's GGUF and (with llama.cpp's source) llama.cpp's converter's GGUF."""
    target, made = zoo
    out = {"hf": made[name], "dflash-convert": tmp_path / "ours.gguf"}
    convert(made[name], out["dflash-convert"], outtype="f32", target=target, progress=False, warn=lambda _: None)
    if llama_cpp_src() is not None:
        out["llama.cpp"] = run_oracle(made[name], tmp_path / "oracle.gguf", outtype="f32", target_dir=target)
    return out


@pytest.mark.parametrize("name", ["zlab-self-contained", "zlab-mimo-no-sinks"])
def test_equals_zlab_with_llama_cpp_embedding_and_head(zoo, tmp_path: Path, name: str) -> None:
    target, made = zoo
    feats, anchors = inputs()
    expect = reference_rounds(made[name], target, feats, anchors)
    for form, path in forms(zoo, name, tmp_path).items():
        got = our_rounds(path, target, feats, anchors)
        worst = max(rel(g, e) for g, e in zip(got, expect))
        MEASURED[f"{name} {form}"] = worst
        print(f"\n{name} ({form}), 3 rounds: max relative difference {worst:.3g}")
        assert worst < RTOL, (name, form, worst)
        assert all(torch.equal(g.argmax(-1), e.argmax(-1)) for g, e in zip(got, expect))
    # and the drafter's own tables matter: with the target's embedding and head the logits differ
    plain = tmp_path / "plain"
    shutil.copytree(made[name], plain)
    (plain / "mask_embedding.pt").unlink(missing_ok=True)
    if name == "zlab-self-contained":
        from safetensors.torch import load_file, save_file

        kept = {k: v for k, v in load_file(str(plain / "model.safetensors")).items() if k not in ("embed_tokens.weight", "lm_head.weight")}
        save_file(kept, str(plain / "model.safetensors"), metadata={"format": "pt"})
    assert rel(our_rounds(plain, target, feats, anchors)[0], expect[0]) > 1e-3


def test_mimo_with_sinks_same_in_every_form(zoo, tmp_path: Path) -> None:
    """MiMo as published (sinks + mask_embedding.pt): the HF directory and the GGUFs draft the same logits, and
    the noise embedding of the mask token is mask_embedding.pt's vector (the row llama.cpp's GGUF holds)."""
    target, made = zoo
    feats, anchors = inputs(6)
    runs = {form: our_rounds(path, target, feats, anchors) for form, path in forms(zoo, "zlab-mimo", tmp_path).items()}
    for form, got in runs.items():
        worst = max(rel(g, e) for g, e in zip(got, runs["hf"]))
        MEASURED[f"zlab-mimo {form} vs hf"] = worst
        print(f"\nzlab-mimo ({form} vs hf), 3 rounds: max relative difference {worst:.3g}")
        assert worst < RTOL, (form, worst)
    mask = torch.load(made["zlab-mimo"] / "mask_embedding.pt", weights_only=True)
    model, head = load_drafter(made["zlab-mimo"]), load_target_head(target)
    ids = torch.tensor([[7, make_zoo.MASK_TOKEN_ID]])
    emb = model.noise_embedding(ids, head)[0]
    assert torch.equal(emb[1], mask["embedding"].float()) and torch.equal(emb[0], head.embed(ids)[0, 0])
    assert not torch.equal(emb[1], head.embed(ids)[0, 1])
    assert "mask_embedding.pt replaces the mask token's embedding row" in " ".join(model.load_info.notes)
