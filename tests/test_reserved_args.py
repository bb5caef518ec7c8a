"""Issue 39, item 6: ``--llama-cpp-arg`` refuses every llama.cpp argument that loads a model, sets the port or the
host, or changes what dflashkit measures — read from each pinned build's own ``common/arg.cpp`` by what the option
does, under every alias (presets such as ``--fim-qwen-7b-spec`` and ``--embd-gemma-default`` included), so a build's
new alias is found here, not by a user."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dflashkit.errors import UsageError
from dflashkit.llama_cpp import check_extra_args
from dflashkit.llama_cpp.reserved_args import RESERVED_ARGS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import reserved_args  # noqa: E402

BUILDS = [("0.3.36", "DFLASHKIT_LLAMA_CPP_SRC"), ("b11549", "DFLASHKIT_LLAMA_CPP_MAINLINE_SRC")]


@pytest.mark.parametrize("build, var", BUILDS)
def test_every_argument_that_sets_a_model_port_or_measured_setting_is_refused(build: str, var: str) -> None:
    if not os.environ.get(var):
        pytest.skip(f"set {var} to the llama.cpp {build} source tree (.ci/run sets it)")
    arg_cpp = Path(os.environ[var]) / "common" / "arg.cpp"
    options = reserved_args.options(arg_cpp.read_text(encoding="utf-8", errors="replace"))
    assert len(options) > 300 and all(flags for flags, _ in options)  # the parser reads the whole table
    table = reserved_args.reserved(arg_cpp)
    for must in ("-m", "-md", "--port", "--host", "-hf", "-hfd", "-dr", "--fim-qwen-7b-spec", "--spec-default",
                 "--spec-draft-n-max", "-ctkd", "--temp", "-c", "-np"):
        assert must in table, must  # what the parser is meant to find, it finds
    missing = sorted(set(table) - set(RESERVED_ARGS))
    assert missing == [], f"regenerate: python tools/reserved_args.py --write ({missing[:10]})"
    for flag in table:
        with pytest.raises(UsageError, match=f"--llama-cpp-arg {flag}=1: {flag} "):
            check_extra_args([f"{flag}=1"])


def test_an_option_of_the_users_own_machine_passes() -> None:
    assert check_extra_args(["--no-repack", "-fa", "on", "-C", "0-3", "--mlock"]) == [
        "--no-repack", "-fa", "on", "-C", "0-3", "--mlock"]
