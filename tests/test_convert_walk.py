"""The convert walk asks the family registry once: the family that read the source is the one every check,
the tensor set and the metadata use (issue 42, item 3). Before, one conversion looked its family up five times
(`family_for_spec` three times, `family_for_architecture` once, beside the config's own lookup) and a translation
seven. Counted with a profile hook on the registry's lookup functions, so a lookup added anywhere on the walk
(a check, a helper, the writer) shows up here."""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import dflashkit.families as registry
from conftest import FAMILIES, target_for
from dflashkit.converters.convert import convert
from dflashkit.drafters import open_drafter

LOOKUPS = frozenset(name for name in dir(registry) if name.startswith("family_for"))
QUIET: dict[str, Any] = dict(progress=False, warn=lambda m: None)


def lookups_during(fn: Callable[[], object]) -> dict[str, int]:
    """How many times each registry lookup ran while ``fn`` ran."""
    calls: collections.Counter[str] = collections.Counter()
    registry_file = registry.family_for_spec.__code__.co_filename

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == registry_file and frame.f_code.co_name in LOOKUPS:
            calls[frame.f_code.co_name] += 1

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return dict(calls)


def test_the_hook_sees_a_lookup(drafters) -> None:
    """The counter itself: a direct lookup is seen (so the counts below are not from a blind hook)."""
    with open_drafter(drafters["qwen3-b16"]) as d:
        spec = d.require_spec()
    assert lookups_during(lambda: registry.family_for_spec(spec)) == {"family_for_spec": 1}


@pytest.mark.parametrize("family", FAMILIES)
def test_conversion_asks_the_registry_once(family: str, drafters, targets, tmp_path: Path) -> None:
    target = target_for(family, targets)
    seen = lookups_during(lambda: convert(drafters[family], tmp_path / "out.gguf", outtype="q8_0", target=target,
                                          **QUIET))
    assert seen == {"family_for_config": 1}
    assert (tmp_path / "out.gguf").stat().st_size > 0


def test_translation_asks_the_registry_once_after_reading_the_metadata(drafters, targets, tmp_path: Path) -> None:
    target = target_for("qwen3-b16", targets)
    source = tmp_path / "src.gguf"
    convert(drafters["qwen3-b16"], source, outtype="f16", target=target, **QUIET)
    seen = lookups_during(lambda: convert(source, tmp_path / "luce.gguf", dialect="luce", target=target, **QUIET))
    # family_for_gguf names the architecture while the metadata decodes; family_for_spec is the walk's one lookup
    assert seen == {"family_for_gguf": 1, "family_for_spec": 1}
    assert (tmp_path / "luce.gguf").stat().st_size > 0
