"""The family registry: HF configs are claimed by their family (by architecture string or by
config shape), every family's tensors can be written in the llama.cpp dialect, and the converter
path never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflashkit import families
from dflashkit.dialects import LLAMA_CPP
from dflashkit.errors import DFlashError
from dflashkit.families.base import DrafterFamily
from dflashkit.families.zlab_dflash import ZLAB_TENSORS


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize(("fixture", "family"), [("qwen3-b16", "zlab-dflash"), ("dflash2", "zlab-dflash2")])
def test_config_saved_by_zlab_is_claimed_by_its_family(drafters, fixture: str, family: str) -> None:
    # the fixtures are saved with z-lab's own classes (save_pretrained): their architectures string is the real one
    config = _config(drafters[fixture])
    assert families.family_for_config(config).name == family
    assert families.family_for_config(config).architectures == tuple(config["architectures"])


def test_config_without_architectures_is_dflash() -> None:
    assert families.family_for_config({}).name == "zlab-dflash"


def test_unknown_architecture_names_the_known_ones() -> None:
    with pytest.raises(DFlashError) as info:
        families.family_for_config({"architectures": ["LlamaForCausalLM"]}, "d/config.json")
    prefix = "d/config.json: architecture 'LlamaForCausalLM' is not a DFlash drafter (expected one of "
    message = str(info.value)
    assert message.startswith(prefix) and message.endswith(")"), message
    listed = message[len(prefix):-1].split(", ")
    # every architecture string a registered family claims, in matching order (a new family adds its own)
    assert listed == list(families.KNOWN_ARCHITECTURES)
    known = ["Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel", "LingDSparkModel",
             "Gemma4DSparkModel", "DeepseekV4DSparkModel", "DFlashDraftModel", "DFlash2DraftModel"]
    assert [a for a in listed if a in known] == known


def test_a_family_may_claim_configs_by_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    class ByShape(DrafterFamily):
        name = "by-shape"
        architectures = ("SomeSharedArchitecture",)

        def matches(self, config, architecture):  # told apart by a nested block, not by the string
            return architecture in self.architectures and "speculators_config" in config

    shaped = ByShape()
    monkeypatch.setattr(families, "FAMILIES", (shaped, *families.FAMILIES))
    assert families.family_for_config({"architectures": ["SomeSharedArchitecture"], "speculators_config": {}}) is shaped
    with pytest.raises(DFlashError, match="is not a DFlash drafter"):
        families.family_for_config({"architectures": ["SomeSharedArchitecture"]})


def test_every_family_tensor_has_a_llama_cpp_name() -> None:
    # a family whose tensors the default dialect cannot name could never be converted
    assert all(LLAMA_CPP.has_tensor(t.replace("{bid}", "0")) for t in ZLAB_TENSORS)


def test_converter_path_does_not_import_torch() -> None:
    code = (
        "import sys, dflashkit.cli, dflashkit.converters.convert, dflashkit.converters.translate, "
        "dflashkit.inspect, dflashkit.diff, dflashkit.quantize.gguf_file; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
