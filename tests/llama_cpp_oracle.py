"""llama.cpp's own HF -> GGUF converter as a test oracle, and a readable GGUF comparison.

llama.cpp's ``convert_hf_to_gguf.py`` is plain Python: the tests run it from the llama-cpp-python sdist
(``vendor/llama.cpp``, located by the environment variable ``DFLASHKIT_LLAMA_CPP_SRC``) in a
subprocess, with ``PYTHONPATH`` = its own ``gguf-py``, and compare our converter's output with its
output. Without the variable (or with a directory that is not a llama.cpp source tree) the tests that
need it skip with a one-line reason.

One bypass, and only one: llama.cpp identifies a BPE pre-tokenizer by hashing the ids its tokenizer
gives for a fixed check text (``get_vocab_base_pre``). The fixture tokenizers are tiny (~500 tokens),
so no hash in its table matches them and it raises ``NotImplementedError``. The runner script below
wraps that method in the subprocess: the original runs first, and only when it raises is the
pre-tokenizer name given by the caller (``pre``, default ``"qwen2"``, the Split regex the fixtures
use) returned instead. Nothing else in the converter is touched.

The converter's imports (torch, its own gguf-py, the ``conversion`` package with every model class, transformers'
tokenizers) take ~4 s, longer than converting a fixture. So each source tree gets one resident process (`_Zygote`)
that imports them once and then forks one child per conversion: the child sets ``sys.argv`` and runs the script as
``__main__`` exactly as the one-shot runner does, with its stdout and stderr in a log file, and its exit status is
the conversion's. Every conversion still runs the converter's whole code in a fresh process; only the imports are
shared (where fork is missing, each conversion is a subprocess of its own).

Hand-written here rather than taken from gguf-py: ``compare_gguf`` (gguf-py reads a file but has no
diff); reading itself goes through ``gguf.GGUFReader``.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Collection
from typing import Any

import numpy as np
import pytest

from dflashkit.llama_cpp.target import CONVERTER_RUNNER, CONVERTER_SETUP

ENV_VAR = "DFLASHKIT_LLAMA_CPP_SRC"
OUTTYPES = ("f32", "f16", "bf16", "q8_0")

# Runs convert_hf_to_gguf.py as __main__ after wrapping get_vocab_base_pre (see the module docstring): the one
# runner, shared with dflash-accept's target conversion (dflashkit.llama_cpp).
_RUNNER = CONVERTER_RUNNER


class OracleError(RuntimeError):
    """llama.cpp's converter exited non-zero; ``message`` is the last line it printed (the exception)."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.message = message
        self.output = output


#: the pinned llama.cpp builds whose converter is an oracle: build → the variable naming its source tree
#: (.ci/run sets both; docs/llama-cpp.md says how to add the next build)
BUILDS = {"0.3.36": ENV_VAR, "b11549": "DFLASHKIT_LLAMA_CPP_MAINLINE_SRC"}
DEFAULT_BUILD = "0.3.36"
_WHERE = {"0.3.36": "vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist",
          "b11549": "thirdparty/llama.cpp of the xllamacpp 2026.10.11549 sdist"}


def llama_cpp_src(build: str = DEFAULT_BUILD) -> Path | None:
    """The source tree of ``build`` named by its variable, or None when unset or not one."""
    value = os.environ.get(BUILDS[build])
    if not value:
        return None
    src = Path(value)
    if not (src / "convert_hf_to_gguf.py").is_file() or not (src / "gguf-py" / "gguf").is_dir():
        return None
    return src


def require_llama_cpp_src(build: str = DEFAULT_BUILD) -> Path:
    """The source tree of ``build``, or pytest.skip with a one-line reason."""
    src = llama_cpp_src(build)
    var = BUILDS[build]
    if src is None:
        value = os.environ.get(var)
        if value:
            pytest.skip(f"{var}={value} holds no convert_hf_to_gguf.py + gguf-py (llama.cpp source)")
        pytest.skip(f"set {var} to llama.cpp {build}'s source ({_WHERE[build]})")
    # its Qwen vocab path imports sentencepiece before it looks for tokenizer.model (requirements.txt has it)
    if importlib.util.find_spec("sentencepiece") is None:
        pytest.skip("llama.cpp's converter needs the sentencepiece module (pip install sentencepiece)")
    return src


#: build → the variable naming its bin/ folder (llama-quantize, llama-speculative-simple, llama-server)
BIN_VARS = {"0.3.36": "DFLASHKIT_LLAMA_CPP_BIN", "b11549": "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN"}


def require_llama_cpp_build(build: str, tool: str) -> tuple[Path, Path]:
    """(bin folder, source tree) of ``build``, its ``tool`` built and its converter at hand, or pytest.skip naming
    what to set."""
    binary = Path(os.environ.get(BIN_VARS[build], "/nonexistent"))
    src = llama_cpp_src(build)
    if not (binary / tool).exists() or src is None:
        pytest.skip(f"llama.cpp build {build}: set {BIN_VARS[build]} (with {tool}) and {BUILDS[build]} "
                    "(.ci/run builds both)")
    return binary, src


_GGML_LIBS: dict[tuple[str, str], ctypes.CDLL] = {}


def ggml_library(build: str, name: str) -> ctypes.CDLL:
    """``name`` (``libggml-base.so``, ``libggml-cpu.so``) of ``build``'s bin/ folder, loaded once, or pytest.skip
    naming the variable to set."""
    if (build, name) not in _GGML_LIBS:
        var = BIN_VARS[build]
        bin_dir = os.environ.get(var)
        lib = Path(bin_dir or "") / name
        if not bin_dir or not lib.is_file():
            pytest.skip(f"set {var} to the bin/ folder of the llama.cpp {build} build (.ci/run builds it with {name})")
        _GGML_LIBS[build, name] = ctypes.CDLL(str(lib))
    return _GGML_LIBS[build, name]


@pytest.fixture(scope="module", params=list(BUILDS))
def oracle_build(request: pytest.FixtureRequest) -> str:
    """Each pinned build whose converter is at hand (the others skip with their reason): parametrizes a test
    (or a module fixture) over the oracles."""
    require_llama_cpp_src(request.param)
    return request.param


def run_oracle(
    model_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    outtype: str = "f32",
    target_dir: str | os.PathLike[str] | None = None,
    pre: str = "qwen2",
    extra_args: tuple[str, ...] = (),
    src: Path | None = None,
    timeout: float = 600,
    build: str = DEFAULT_BUILD,
) -> Path:
    """Convert ``model_dir`` with llama.cpp's convert_hf_to_gguf.py; returns ``out``.

    ``target_dir`` goes to ``--target-model-dir`` (drafters take the target's tokenizer from it).
    Raises ``OracleError`` (with the converter's last output line) when it fails; skips when the
    source is absent.
    """
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not one of {OUTTYPES}")
    src = src or require_llama_cpp_src(build)
    out = Path(out)
    args = [str(model_dir), "--outtype", outtype, "--outfile", str(out)]
    if target_dir is not None:
        args += ["--target-model-dir", str(target_dir)]
    args += list(extra_args)
    if hasattr(os, "fork"):
        returncode, output = _zygote(src).convert(args, pre, timeout)
    else:
        proc = subprocess.run([sys.executable, "-c", _RUNNER, str(src), pre, *args], capture_output=True, text=True,
                              env=_oracle_env(src), timeout=timeout)
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    if returncode != 0:
        lines = [line for line in output.splitlines() if line.strip()]
        raise OracleError(lines[-1] if lines else f"exit {returncode}", output)
    if not out.is_file():
        raise OracleError(f"converter exited 0 but wrote no {out}", output)
    return out


def _oracle_env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_OFFLINE")}
    env["PYTHONPATH"] = str(src / "gguf-py")
    env["HF_HUB_OFFLINE"] = "1"  # the converter must never reach the hub for a fixture
    return env


# The resident process: imports what the converter imports, then per request (a JSON line on stdin: the converter's
# arguments, the pre-tokenizer answer, a log path) forks a child that runs convert_hf_to_gguf.py as __main__ the way
# CONVERTER_RUNNER does, its fds 1 and 2 on the log; replies {"pid": …} at the fork and {"status": …} at its end.
_ZYGOTE_SCRIPT = r"""
import json, os, runpy, sys, traceback
src = sys.argv[1]
script = src + "/convert_hf_to_gguf.py"
pre = ["qwen2"]
""" + CONVERTER_SETUP + r"""
import torch, gguf  # noqa: F401  the converter's first imports (conversion, imported above, has every model class)
try:
    import transformers  # noqa: F401  the vocabulary step's AutoTokenizer
    from transformers import AutoConfig, AutoTokenizer  # noqa: F401
except ImportError:
    pass
reply = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.stdin.close()
        pre[0] = request["pre"]
        sys.argv = [script] + request["args"]
        code = 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:  # as the interpreter treats it at exit
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            import logging
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    reply.write(json.dumps({"pid": pid}) + "\n")
    reply.flush()
    _, status = os.waitpid(pid, 0)
    reply.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
    reply.flush()
"""


class _Zygote:
    """One resident converter process for a source tree (see the module docstring); one conversion at a time."""

    def __init__(self, src: Path) -> None:
        self._lock = threading.Lock()
        self._src = src
        self._proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE_SCRIPT, str(self._src)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                          env=_oracle_env(self._src))
        return self._proc

    def _reply(self, proc: subprocess.Popen[str], deadline: float | None) -> dict[str, Any]:
        assert proc.stdout is not None
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([proc.stdout], [], [], wait)
            if not ready:
                raise TimeoutError
            line = proc.stdout.readline()
            if not line:
                raise OracleError("the resident converter process ended", "")
            return json.loads(line)

    def convert(self, args: list[str], pre: str, timeout: float) -> tuple[int, str]:
        with self._lock, tempfile.TemporaryDirectory(prefix="oracle-") as tmp:
            log = Path(tmp) / "log"
            proc = self._start()
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"args": args, "pre": pre, "log": str(log)}) + "\n")
            proc.stdin.flush()
            pid = self._reply(proc, None)["pid"]
            try:
                status = self._reply(proc, time.monotonic() + timeout)["status"]
            except TimeoutError:
                os.kill(pid, 9)
                self._reply(proc, None)
                raise subprocess.TimeoutExpired(["convert_hf_to_gguf.py", *args], timeout) from None
            return status, log.read_text(errors="replace") if log.exists() else ""

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


_ZYGOTES: dict[Path, _Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def _zygote(src: Path) -> _Zygote:
    with _ZYGOTES_LOCK:
        if src not in _ZYGOTES:
            _ZYGOTES[src] = _Zygote(src)
        return _ZYGOTES[src]


@atexit.register
def _close_zygotes() -> None:
    for z in _ZYGOTES.values():
        z.close()


# --------------------------------------------------------------------------------------------
# comparison


def _field_value(field: Any) -> Any:
    """A metadata field's value as plain Python (str, int, float, bool, list)."""
    import gguf

    types = list(field.types)
    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) > 1 and types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    return field.parts[field.data[0]].tolist()[0]


def _type_name(field: Any) -> str:
    return "[".join(t.name for t in field.types) + "]" * (len(field.types) - 1)


def read_gguf(path: str | os.PathLike[str]) -> tuple[list[tuple[str, str, Any]], list[tuple[str, str, tuple[int, ...], bytes]]]:
    """(metadata [(key, type, value)] in file order, tensors [(name, type, shape ne0-first, bytes)] in order)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = [
        (field.name, _type_name(field), _field_value(field))
        for field in reader.fields.values()
        if not field.name.startswith("GGUF.")
    ]
    tensors = [
        (t.name, t.tensor_type.name, tuple(int(n) for n in t.shape), np.asarray(t.data).tobytes())
        for t in reader.tensors
    ]
    return meta, tensors


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(value) if hasattr(value, '__len__') else '?'} items)"


def compare_gguf(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    ordered: bool = True,
    ignore_keys: Collection[str] = (),
) -> list[str]:
    """Readable differences between two GGUF files (empty when they agree).

    Metadata: presence, order, type and value of every key. Tensors: presence, order, type, shape and
    data bytes. ``ordered=False`` leaves out the two order checks; ``ignore_keys`` leaves out those
    metadata keys entirely. With the defaults an empty list means the same header version, the same
    key/value pairs in the same order and the same tensors in the same order with the same bytes.
    """
    import gguf

    diffs: list[str] = []
    ra, rb = gguf.GGUFReader(str(a)), gguf.GGUFReader(str(b))
    va, vb = _field_value(ra.fields["GGUF.version"]), _field_value(rb.fields["GGUF.version"])
    if va != vb:
        diffs.append(f"header GGUF.version: {va} != {vb}")
    meta_a, tensors_a = read_gguf(a)
    meta_b, tensors_b = read_gguf(b)
    meta_a = [m for m in meta_a if m[0] not in ignore_keys]
    meta_b = [m for m in meta_b if m[0] not in ignore_keys]
    keys_a, keys_b = [k for k, _, _ in meta_a], [k for k, _, _ in meta_b]
    for key in keys_a:
        if key not in keys_b:
            diffs.append(f"metadata {key}: only in a")
    for key in keys_b:
        if key not in keys_a:
            diffs.append(f"metadata {key}: only in b")
    common_a = [k for k in keys_a if k in keys_b]
    common_b = [k for k in keys_b if k in keys_a]
    if ordered and common_a != common_b:
        diffs.append(f"metadata order differs: a {common_a} / b {common_b}")
    by_b = {k: (t, v) for k, t, v in meta_b}
    for key, type_a, value_a in meta_a:
        if key not in by_b:
            continue
        type_b, value_b = by_b[key]
        if type_a != type_b:
            diffs.append(f"metadata {key}: type {type_a} != {type_b}")
        elif value_a != value_b:
            diffs.append(f"metadata {key}: {_short(value_a)} != {_short(value_b)}")
    names_a, names_b = [t[0] for t in tensors_a], [t[0] for t in tensors_b]
    for name in names_a:
        if name not in names_b:
            diffs.append(f"tensor {name}: only in a")
    for name in names_b:
        if name not in names_a:
            diffs.append(f"tensor {name}: only in b")
    common_ta = [n for n in names_a if n in names_b]
    common_tb = [n for n in names_b if n in names_a]
    if ordered and common_ta != common_tb:
        diffs.append(f"tensor order differs: a {common_ta} / b {common_tb}")
    tb = {t[0]: t for t in tensors_b}
    for name, type_a, shape_a, data_a in tensors_a:
        if name not in tb:
            continue
        _, type_b, shape_b, data_b = tb[name]
        if type_a != type_b:
            diffs.append(f"tensor {name}: type {type_a} != {type_b}")
        if shape_a != shape_b:
            diffs.append(f"tensor {name}: shape {list(shape_a)} != {list(shape_b)}")
        if type_a == type_b and shape_a == shape_b and data_a != data_b:
            n_diff = sum(x != y for x, y in zip(data_a, data_b)) + abs(len(data_a) - len(data_b))
            diffs.append(f"tensor {name}: {n_diff} of {len(data_a)} bytes differ")
    return diffs


def describe_gguf(path: str | os.PathLike[str]) -> list[str]:
    """One line per metadata key (key, type, value) and per tensor (name, type, shape), in file order."""
    meta, tensors = read_gguf(path)
    lines = [f"{key} {type_} = {_short(value)}" for key, type_, value in meta]
    lines += [f"{name} {type_} {list(shape)}" for name, type_, shape, _ in tensors]
    return lines
