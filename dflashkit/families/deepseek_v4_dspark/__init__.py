"""DeepSeek-V4 DSpark (``DeepseekV4DSparkModel``): refused by name.

A DSpark drafter on a DeepSeek-V4 backbone (the ``mtp.*`` part of a DeepSeek-V4 checkpoint: MLA
attention, hyper-connections, MoE) is not a DFlash-family drafter dflashkit can express; llama.cpp's
own converter exports it from the full DeepSeek-V4 checkpoint. This family only claims the name so the
refusal says what the checkpoint is instead of "unknown architecture".
"""

from __future__ import annotations

from typing import Any, Mapping

from ...errors import DFlashError
from ...spec import ConfigView, DrafterSpec
from ..base import DrafterFamily

ARCH_DEEPSEEK_V4_DSPARK = "DeepseekV4DSparkModel"


class DeepseekV4DSpark(DrafterFamily):
    name = "deepseek-v4-dspark"
    llama_cpp_spec_type = "draft-dspark"  # the Markov head (common_speculative_types_from_gguf)
    priority = 50
    architectures = (ARCH_DEEPSEEK_V4_DSPARK,)
    runtime_unsupported = "a DeepSeek-V4 backbone (hyper-connections, MLA, MoE)"

    def spec_from_config(self, config: Mapping[str, Any], view: ConfigView, architecture: str, path: str) -> DrafterSpec:
        raise DFlashError(
            f"{path}: architecture '{architecture}' is a DSpark drafter on a DeepSeek-V4 backbone (MLA attention, "
            "hyper-connections, MoE); dflashkit does not convert DeepSeek-V4 DSpark — llama.cpp's own converter "
            "(convert_hf_to_gguf.py) handles full DeepSeek-V4 checkpoints"
        )

    def hf_to_canonical(self, hf_name: str) -> str | None:
        return None

    def expected_tensors(self, spec: DrafterSpec, *, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:
        return {}


FAMILY = DeepseekV4DSpark.instance
