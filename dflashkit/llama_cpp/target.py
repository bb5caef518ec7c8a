"""The target as a GGUF for llama.cpp: given, or made from the HF target by llama.cpp's own converter.

The converter is ``convert_hf_to_gguf.py`` from llama.cpp's source (``DFLASHKIT_LLAMA_CPP_SRC`` or
``--llama-cpp-src``), run with its own gguf-py in a subprocess. It names a BPE pre-tokenizer by hashing its ids for
a check text; a tokenizer that no published model shares (such as the fixtures') is unknown to its table, and then
— only then — the name dflashkit's tokenizer reader derives from the Split regex (``converters.tokenizer``) is
handed to it instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from ..converters.tokenizer import load_backend, pre_tokenizer_name
from ..errors import DFlashError, UsageError
from ..files.tempdirs import make_temp_dir, remove_temp_dir
from .process import run_bounded

SRC_ENV = "DFLASHKIT_LLAMA_CPP_SRC"
TIMEOUT_S = 600


# The converter's tree ``src`` first on sys.path, and only an unknown pre-tokenizer hash answered with ``pre[0]``
# (module doc); the script that runs it defines ``src`` and ``pre`` (a list: a resident process changes it per run).
CONVERTER_SETUP = r"""
sys.path[:0] = [src + "/gguf-py", src]
try:
    from conversion import base  # llama.cpp trees with the conversion/ package
except ImportError:  # an older single-file converter: run it as it is
    base = None
if base is not None:
    _original = base.TextModel.get_vocab_base_pre
    def _get_vocab_base_pre(self, tokenizer):
        try:
            return _original(self, tokenizer)
        except NotImplementedError:
            return pre[0]
    base.TextModel.get_vocab_base_pre = _get_vocab_base_pre
"""

# Runs convert_hf_to_gguf.py as __main__: ``-c CONVERTER_RUNNER SRC PRE ARGS...``.
CONVERTER_RUNNER = r"""
import runpy, sys
src, pre = sys.argv[1], [sys.argv[2]]
script = src + "/convert_hf_to_gguf.py"
sys.argv = [script] + sys.argv[3:]
""" + CONVERTER_SETUP + r"""
runpy.run_path(script, run_name="__main__")
"""


def llama_cpp_src(explicit: str | os.PathLike | None = None) -> Path | None:
    """llama.cpp's source tree (``convert_hf_to_gguf.py`` + ``gguf-py``): the given one, else $DFLASHKIT_LLAMA_CPP_SRC."""
    value = explicit if explicit is not None else os.environ.get(SRC_ENV)
    if not value:
        return None
    src = Path(value)
    if not (src / "convert_hf_to_gguf.py").is_file() or not (src / "gguf-py" / "gguf").is_dir():
        if explicit is not None:
            raise UsageError(f"--llama-cpp-src {src}: no convert_hf_to_gguf.py and gguf-py there (give llama.cpp's "
                             "source tree)")
        return None
    return src


def target_gguf_from_hf(hf_dir: str | os.PathLike, out: str | os.PathLike, src: Path, *, outtype: str = "bf16",
                        timeout: float = TIMEOUT_S) -> Path:
    """Convert an HF target with llama.cpp's own converter (in a subprocess, its own gguf-py)."""

    hf_dir, out = Path(hf_dir), Path(out)
    tokenizer_json = hf_dir / "tokenizer.json"
    try:
        doc = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        pre = pre_tokenizer_name(load_backend(tokenizer_json), tokenizer_json, doc)
    except (OSError, ValueError, DFlashError):
        pre = "default"  # the converter's own table decides, or it says why not
    cmd = [sys.executable, "-c", CONVERTER_RUNNER, str(src), pre, str(hf_dir), "--outtype", outtype,
           "--outfile", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(src / "gguf-py")
    env["HF_HUB_OFFLINE"] = "1"
    try:
        # as llama.cpp's programs run: its own process group, stopped on a signal (a plain subprocess.run's wait
        # can hang there: process.poll_child), stderr kept bounded (its errors and its last lines are there)
        returncode, output = run_bounded(cmd, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise DFlashError(f"{hf_dir}: llama.cpp's convert_hf_to_gguf.py did not finish in {timeout:.0f} s — convert "
                          "the target once yourself and pass --target-gguf FILE") from None
    if returncode != 0 or not out.is_file():
        lines = [line for line in output.splitlines() if line.strip()]
        raise DFlashError(f"{hf_dir}: llama.cpp's convert_hf_to_gguf.py could not convert the target "
                          f"({lines[-1] if lines else 'exit ' + str(returncode)}) — pass --target-gguf FILE")
    return out


@contextlib.contextmanager
def temp_dir() -> Iterator[str]:
    """A temporary folder for converted GGUFs, removed when the block ends; named with this PID, so the next
    command removes it if this process is killed outright (`files.tempdirs`)."""
    path = make_temp_dir("llama")
    try:
        yield path
    finally:
        remove_temp_dir(path)
