"""The tap boundary, one rule in every command (`target_rules.taps_out_of_range`): for an n-layer target a tap id
(HF decoder-layer id) may be 0 .. n − 2. llama.cpp is the oracle (a build, where the test has one): it taps the input
of layer id + 1 and aborts ("layer input tensor is null") when that layer does not exist, i.e. from i = n − 1 on —
where transformers' hidden_states[n] would also be the *normed* final state, not a layer output.

The trained pair's target has 4 layers: taps [1, 2] are fine, [1, 3] is i = n − 1, [1, 4] is i = n.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as V

from dflashkit.cli import accept_command, convert_command, inspect_command, parity_command
from dflashkit.converters.convert import convert
from dflashkit.target_rules import taps_out_of_range

from hostile import rewrite_gguf

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
TARGET = TRAINED / "target"
N = 4
BIN = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_BIN", "/nonexistent"))

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_rule() -> None:
    assert taps_out_of_range([0, 1, N - 2], N) == []
    assert taps_out_of_range([1, N - 1], N) == [N - 1]
    assert taps_out_of_range([1, N, -1], N) == [-1, N]


@pytest.fixture(scope="module")
def tapped(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The trained drafter with its second tap at i = n − 2, n − 1 and n (HF dirs)."""
    out = {}
    for last in (N - 2, N - 1, N):
        d = tmp_path_factory.mktemp(f"tap{last}") / "drafter"
        shutil.copytree(TRAINED / "drafter", d)
        config = json.loads((d / "config.json").read_text())
        config["dflash_config"]["target_layer_ids"] = [1, last]
        (d / "config.json").write_text(json.dumps(config))
        out[last] = d
    return out


@pytest.mark.parametrize("last, ok", [(N - 2, True), (N - 1, False), (N, False)])
def test_convert(tapped: dict[int, Path], tmp_path: Path, last: int, ok: bool) -> None:
    r = CliRunner().invoke(convert_command, [str(tapped[last]), str(tmp_path / "d.gguf"), "--target", str(TARGET), "-q"])
    if ok:
        assert r.exit_code == 0, r.output
    elif last == N - 1:  # the target rule
        assert r.exit_code == 1 and f"drafter target layer id {last} taps layer {last + 1} but the target has {N} " \
                                      f"layers (ids + 1 must be < {N})" in r.output, r.output
    else:  # past num_target_layers: the config itself is refused first
        assert r.exit_code == 1 and f"target layer id {last} is past the target's last layer" in r.output, r.output


@pytest.mark.parametrize("last, ok", [(N - 2, True), (N - 1, False), (N, False)])
def test_inspect(tapped: dict[int, Path], last: int, ok: bool) -> None:
    r = CliRunner().invoke(inspect_command, [str(tapped[last]), "--target", str(TARGET), "--format", "json"])
    ids = [f["id"] for f in json.loads(r.stdout)["files"][0]["findings"]]
    refused = "target.tap_range" in ids or "drafter.config_invalid" in ids
    assert refused is not ok and (r.exit_code == 0) is ok, ids


@pytest.mark.parametrize("last, ok", [(N - 2, True), (N - 1, False), (N, False)])
def test_accept(tapped: dict[int, Path], last: int, ok: bool) -> None:
    r = CliRunner().invoke(accept_command, [str(tapped[last]), "--target", str(TARGET), "--prompts",
                                            str(TRAINED / "prompts.jsonl"), "--max-prompts", "1",
                                            "--max-new-tokens", "8", "-q", "--format", "json"])
    if ok:
        assert r.exit_code == 0, r.output
    elif last == N - 1:
        assert r.exit_code == 2 and f"taps target layer id(s) [{last}] but target" in r.output, r.output
        assert f"(ids must be 0 .. {N - 2};" in r.output
    else:
        assert r.exit_code == 1 and f"target layer id {last} is past the target's last layer" in r.output, r.output


@pytest.mark.parametrize("last, ok", [(N - 2, True), (N - 1, False), (N, False)])
def test_parity(tapped: dict[int, Path], last: int, ok: bool) -> None:
    r = CliRunner().invoke(parity_command, [str(TRAINED / "drafter"), str(tapped[last]), "--target", str(TARGET),
                                            "--skip-weights", "-q"])
    if ok:
        assert r.exit_code in (0, 1) and "taps layer id(s)" not in r.output, r.output
    else:
        assert r.exit_code in (1, 2) and f"layer id(s) [{last}]" in r.output or \
            f"target layer id {last} is past" in r.output, r.output


@pytest.mark.slow
@pytest.mark.skipif(not (BIN / "llama-speculative-simple").exists(),
                    reason=os.environ.get("DFLASHKIT_LLAMA_CPP_SKIP_REASON")
                    or "set DFLASHKIT_LLAMA_CPP_BIN to a llama.cpp build with llama-speculative-simple")
def test_llama_cpp_is_the_oracle_past_the_last_layer(tmp_path: Path) -> None:
    from dflashkit.llama_cpp import llama_cpp_src, target_gguf_from_hf

    src = llama_cpp_src()
    if src is None:
        pytest.skip("set DFLASHKIT_LLAMA_CPP_SRC to llama.cpp's source (its converter makes the target GGUF)")
    target = target_gguf_from_hf(TARGET, tmp_path / "target.gguf", src)
    good = tmp_path / "good.gguf"
    convert(TRAINED / "drafter", good, outtype="bf16", target=TARGET, progress=False, warn=lambda m: None)

    def run(stored: list[int]) -> subprocess.CompletedProcess[str]:
        d = rewrite_gguf(good, tmp_path / f"taps{stored[-1]}.gguf",
                         set_keys={"dflash.target_layers": (stored, V.ARRAY, V.INT32)})
        return subprocess.run([str(BIN / "llama-speculative-simple"), "-m", str(target), "-md", str(d),
                               "--spec-type", "draft-dflash", "--spec-draft-n-max", "15", "-p", "the old king",
                               "-n", "8", "--temp", "0", "-t", "1", "-c", "256"],
                              capture_output=True, text=True, errors="replace", timeout=300)

    # stored = HF id + 1: [2, 3] is i = n − 2 (runs), [2, 4] is i = n − 1 and [2, 5] is i = n (both abort)
    assert run([2, 3]).returncode == 0
    for stored, message in (([2, 4], "layer input tensor is null"), ([2, 5], "GGML_ASSERT(lid <= model.hparams.n_layer())")):
        r = run(stored)
        assert r.returncode != 0 and message in r.stderr, (stored, r.stderr[-500:])
