"""Issue 16: under a 2 GB cap, no hostile input of the memory class makes any command exceed it or print
"internal error". Each command runs in a child process on each input; the child reports its own peak
RSS (VmHWM) at exit — ``ru_maxrss`` would also count the pytest process it was forked from. RLIMIT_AS
cannot be used: torch reserves address space.

Memory is bounded by the file, not by what it claims: a 180 KB GGUF claiming 2^32-1 layers or a
2^31-wide model, a 600-byte config.json claiming 10^6 or 10^9 layers, an HF target claiming a
300M-token vocabulary — each is refused before anything is sized by the claim.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from gguf import GGUFValueType as V

import hostile
from dflashkit.converters.convert import convert

# slow: every test runs a whole command as a child to measure its peak memory
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(drafters, targets, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("memcap")
    base = folder / "base.gguf"
    convert(drafters["qwen3-b16"], base, outtype="f32", target=targets[64]["gguf"], progress=False, warn=lambda m: None)
    src = drafters["qwen3-b16"]
    vocab_target = folder / "target-vocab"
    shutil.copytree(targets[64]["hf"], vocab_target)
    cfg = json.loads((vocab_target / "config.json").read_text())
    cfg["vocab_size"] = 300_000_000
    (vocab_target / "config.json").write_text(json.dumps(cfg))
    return {
        "base": base,
        "hf_target": targets[64]["hf"],
        "vocab_target": vocab_target,
        "block_count": hostile.rewrite_gguf(base, folder / "blocks.gguf", {"dflash.block_count": (2**32 - 1, V.UINT32)}),
        "embedding": hostile.rewrite_gguf(base, folder / "embd.gguf", {"dflash.embedding_length": (2**31, V.UINT32)}),
        "layers_1e6": hostile.make_hf_case(src, folder / "l6", "layers-1e6"),
        "layers_1e9": hostile.make_hf_case(src, folder / "l9", "layers-1e9-float"),
        "layers_swa": hostile.make_hf_case(src, folder / "lswa", "layers-1e6-use-swa"),
        "src": src,
        "out": folder / "out.gguf",
        "big_config": _big_config(src, folder / "bigcfg"),
        "big_header": _big_header(src, folder / "bighdr"),
    }


def _big_config(src: Path, out: Path) -> Path:
    """A 60 MB config.json of 20 M empty objects (2.9 GB as Python objects, before the container cap)."""
    shutil.copytree(src, out)
    (out / "config.json").write_bytes(b"[" + b"{}," * 20_000_000 + b"{}]")
    return out


def _big_header(src: Path, out: Path) -> Path:
    """A safetensors file whose 90 MB header puts 30 M empty lists in __metadata__."""
    import struct

    shutil.copytree(src, out)
    header = b'{"__metadata__": {"x": [' + b"[]," * 30_000_000 + b'[]]}}'
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return out


# (command, argv with {placeholders}, a word the one-line error must contain)
CASES = [
    ("inspect_command", ["{block_count}"], None),
    ("parity_command", ["{block_count}", "{base}", "--skip-weights"], "dflash.block_count"),
    ("quantize_command", ["{block_count}", "{out}", "Q8_0", "--force", "-q"], None),
    ("convert_command", ["{block_count}", "{out}", "--force", "-q"], "dflash.block_count"),
    ("parity_command", ["{embedding}", "{base}", "--skip-weights"], "dflash.embedding_length"),
    ("accept_command", ["{embedding}", "--target", "{hf_target}", "--max-prompts", "1", "-q"], "dflash.embedding_length"),
    ("convert_command", ["{layers_1e6}", "{out}", "--force", "-q"], "num_hidden_layers"),
    ("convert_command", ["{layers_1e9}", "{out}", "--force", "-q"], "num_hidden_layers"),
    ("convert_command", ["{layers_swa}", "{out}", "--force", "-q"], "num_hidden_layers"),
    ("parity_command", ["{layers_1e6}", "{base}", "--skip-weights"], "num_hidden_layers"),
    ("convert_command", ["{src}", "{out}", "--target", "{vocab_target}", "--force", "-q"], "vocab_size"),
    ("convert_command", ["{big_config}", "{out}", "--force", "-q"], "over the cap of 4000000"),
    ("parity_command", ["{big_config}", "{base}", "--skip-weights"], "over the cap of 4000000"),
    ("convert_command", ["{big_header}", "{out}", "--force", "-q"], "over the cap of 4000000"),
    ("diff_command", ["{big_header}", "{base}"], "over the cap of 4000000"),
]


@pytest.mark.parametrize("command, argv, word", CASES, ids=[f"{c[0]}-{c[1][0]}" for c in CASES])
def test_under_2gb_and_named(inputs: dict[str, Path], command: str, argv: list[str], word: str | None) -> None:
    args = [a.format(**inputs) for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = hostile.run_capped(hostile.cli(command) + args, env=env)
    assert not run.killed and run.peak_rss < hostile.CAP_BYTES, run.describe()
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    if command == "inspect_command":
        assert run.returncode == 1 and "'dflash.block_count' = 4294967295 is out of range" in run.stdout, run.stdout
        return
    if command == "quantize_command":  # a drafter is checked as every command checks it: nothing written
        assert run.returncode == 1 and "'dflash.block_count' = 4294967295 is out of range" in run.stderr, run.describe()
        assert not Path(inputs["out"]).exists()
        return
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1 and word in lines[0], run.stderr
