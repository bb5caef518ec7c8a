"""The zoo fixtures (fixtures/make_zoo.py) are what their own projects' loaders read back, and seeded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import make_zoo

SPECULATORS = [name for name, f in make_zoo.FIXTURES.items() if f.layout == "speculators"]
ZLAB = [name for name, f in make_zoo.FIXTURES.items() if f.layout == "z-lab"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    pytest.importorskip("dflash.model")
    pytest.importorskip("speculators.models.dspark")  # needs speculators' runtime deps (openai, datasets, ...)
    return make_zoo.make_zoo(tmp_path_factory.mktemp("zoo"))


def _safetensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


@pytest.mark.parametrize("name", SPECULATORS)
def test_speculators_fixture_reloads_with_speculators(name: str, zoo) -> None:
    from speculators import SpeculatorModel

    _, made = zoo
    fixture = make_zoo.FIXTURES[name]
    model = SpeculatorModel.from_pretrained(str(made[name]))
    assert type(model).__name__ == fixture.architecture
    assert json.loads((made[name] / "config.json").read_text())["architectures"] == [fixture.architecture]
    state = model.state_dict()
    for key, saved in _safetensors(made[name]).items():
        assert torch.equal(state[key], saved), key
    assert not any(p.isnan().any() for p in model.parameters() if p.is_floating_point())
    if model.config.draft_vocab_size != make_zoo.TARGET_VOCAB:
        absolute = model.d2t + torch.arange(model.d2t.numel())
        assert torch.equal(model.t2d.nonzero().flatten(), absolute)  # d2t offsets and t2d agree


@pytest.mark.parametrize("name", ZLAB)
def test_zlab_fixture_reloads_with_dflash(name: str, zoo) -> None:
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    _, made = zoo
    cls = DFlash2DraftModel if make_zoo.FIXTURES[name].architecture == "DFlash2DraftModel" else DFlashDraftModel
    model = cls.from_pretrained(str(made[name]))
    state = model.state_dict()
    saved = _safetensors(made[name])
    known = {k: v for k, v in saved.items() if k in state}
    # the tensors the z-lab class has no module for are the ones the fixture added on purpose
    assert sorted(set(saved) - set(known)) == sorted(
        k for k in saved if "sink" in k or k in ("embed_tokens.weight", "lm_head.weight")
    )
    for key, value in known.items():
        assert torch.equal(state[key], value), key


def test_fixtures_are_seeded(tmp_path: Path) -> None:
    pytest.importorskip("speculators.models.dspark")
    target = make_zoo.make_target_dir(tmp_path)
    names = ("spec-dspark", "zlab-mimo", "gemma4-dspark")
    first = {n: make_zoo.make_fixture(tmp_path / "a", n, target) for n in names}
    second = {n: make_zoo.make_fixture(tmp_path / "b", n, target) for n in names}
    for name in names:
        files = sorted(p.name for p in first[name].iterdir())
        assert files == sorted(p.name for p in second[name].iterdir())
        for file in files:
            if file.endswith(".pt"):  # torch.save embeds a per-file record name
                a = torch.load(first[name] / file, weights_only=True)
                b = torch.load(second[name] / file, weights_only=True)
                assert a["mask_token_id"] == b["mask_token_id"] and torch.equal(a["embedding"], b["embedding"])
            else:
                assert (first[name] / file).read_bytes() == (second[name] / file).read_bytes(), f"{name}/{file}"
    other = make_zoo.make_fixture(tmp_path / "c", "spec-dspark", target, seed=1)
    assert (other / "model.safetensors").read_bytes() != (first["spec-dspark"] / "model.safetensors").read_bytes()
