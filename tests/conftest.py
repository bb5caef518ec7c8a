"""Shared fixtures: tiny drafters of every schema family and matching tiny targets (generated, seeded)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))

import make_drafters  # noqa: E402
import make_target  # noqa: E402

FAMILIES = list(make_drafters.FAMILIES)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matmuls: one BLAS thread is much faster than two fighting over a shared 2-core box. The runtime
    test modules use it (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``); torch is imported
    only by them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def drafters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family name → HF drafter directory."""
    return make_drafters.make_all(tmp_path_factory.mktemp("drafters"))


def _targets_for(tmp_path_factory: pytest.TempPathFactory, hidden: int, mask: int | None) -> dict[str, Path]:
    root = tmp_path_factory.mktemp(f"target{hidden}")
    hf = make_target.make_hf_target(
        root / "hf", hidden_size=hidden, n_layers=make_drafters.TARGET_LAYERS, mask_token_id=mask
    )
    gguf_path = make_target.make_gguf_target(root / "target.gguf", hf)
    return {"hf": hf, "gguf": gguf_path}


@pytest.fixture(scope="session")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """hidden size → {"hf": dir, "gguf": file}: one target for the 64-wide families, one for gemma4 (72)."""
    return {
        64: _targets_for(tmp_path_factory, 64, make_drafters.MASK_TOKEN_ID),
        72: _targets_for(tmp_path_factory, 72, None),
    }


def target_for(family: str, targets: dict[int, dict[str, Path]], kind: str = "gguf") -> Path:
    hidden = make_drafters.FAMILIES[family]["hidden_size"]
    return targets[hidden][kind]


from llama_cpp_oracle import oracle_build  # noqa: E402,F401 (a fixture: each pinned llama.cpp converter)
