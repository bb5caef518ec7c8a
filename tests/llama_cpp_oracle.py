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

Hand-written here rather than taken from gguf-py: ``compare_gguf`` (gguf-py reads a file but has no
diff); reading itself goes through ``gguf.GGUFReader``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from collections.abc import Collection
from typing import Any

import numpy as np
import pytest

from dflashkit.llama_cpp import CONVERTER_RUNNER

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
    cmd = [sys.executable, "-c", _RUNNER, str(src), pre, str(model_dir), "--outtype", outtype, "--outfile", str(out)]
    if target_dir is not None:
        cmd += ["--target-model-dir", str(target_dir)]
    cmd += list(extra_args)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_OFFLINE")}
    env["PYTHONPATH"] = str(src / "gguf-py")
    env["HF_HUB_OFFLINE"] = "1"  # the converter must never reach the hub for a fixture
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        lines = [line for line in output.splitlines() if line.strip()]
        raise OracleError(lines[-1] if lines else f"exit {proc.returncode}", output)
    if not out.is_file():
        raise OracleError(f"converter exited 0 but wrote no {out}", proc.stdout + proc.stderr)
    return out


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
