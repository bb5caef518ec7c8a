"""A quant type is one module in ``dflashkit/codecs/types/``: the registry fills itself, and every command, the
quantize policy, the file-type table and the runtime read it from there.

The throw-away test adds one module (TQ2_0: ternary levels, 256 values in 66 bytes, a type dflashkit does not write)
to a copy of the package and checks that, with no other file touched, every command that lists types lists it,
``dflash-quantize`` and ``dflash-convert`` write it (the llama.cpp file type, the tensor types, the fallback its module
names), ``--tensor-type`` takes it, ``dflash-inspect`` reads the file, and the runtime's torch dequantizer matches
gguf-py's for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import make_drafters  # on sys.path via conftest
from dflashkit.codecs import QUANT_TYPES
from dflashkit.converters.convert import convert
from dflashkit.filetypes import ALL_FILE_TYPES
from dflashkit.runtime.kernels import TORCH_DEQUANT

PACKAGE = Path(__file__).resolve().parents[1] / "dflashkit"
TYPES = PACKAGE / "codecs" / "types"


def test_every_type_is_one_module_of_the_folder() -> None:
    modules = sorted(p.stem for p in TYPES.glob("*.py") if p.stem != "__init__")
    assert sorted(type(qt).__module__.rpartition(".")[2] for qt in QUANT_TYPES.values()) == modules
    assert all(type(qt).__module__.rpartition(".")[2] == qt.name.lower() for qt in QUANT_TYPES.values())
    # the file types, the runtime's dequantizers and the --tensor-type list come from those modules
    assert sorted(ALL_FILE_TYPES) == sorted(ft.name for qt in QUANT_TYPES.values() for ft in qt.file_types)
    assert list(TORCH_DEQUANT) == list(QUANT_TYPES)
    assert [qt.rank for qt in QUANT_TYPES.values()] == sorted((qt.rank for qt in QUANT_TYPES.values()), reverse=True)


THROWAWAY = '''
"""TQ2_0, a test's throw-away type: qs[64] (2-bit levels q + 1, 4 per byte) | d (fp16) = absmax; x = d * q."""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType as F

from dflashkit.quant_types import FileType

from ..base import KernelQuantType


def _tq2_0_blocks(x: np.ndarray, out: np.ndarray) -> None:
    d = np.abs(x).max(axis=1)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    v = x * inv[:, None]
    levels = (np.trunc(v + np.copysign(np.float32(0.5), v)) + 1).astype(np.uint8).reshape(-1, 2, 4, 32)
    out[:, :64] = (levels[:, :, 0] | levels[:, :, 1] << 2 | levels[:, :, 2] << 4 | levels[:, :, 3] << 6).reshape(-1, 64)
    out[:, 64:] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)


class TQ2_0(KernelQuantType, ggml_type=Q.TQ2_0):
    _kernel = _tq2_0_blocks
    needs_numba = False
    fallback = Q.Q4_0
    fp16_fields = (64,)
    file_types = (FileType("TQ2_0", F.MOSTLY_TQ2_0, Q.TQ2_0, rank=21),)

    def dequantize_blocks(self, q: np.ndarray) -> np.ndarray:
        import gguf.quants

        return gguf.quants.dequantize(np.ascontiguousarray(q), self.ggml_type).astype(np.float32, copy=False)

    def dequantize_torch(self, ops: Any, blocks: Any, out: Any) -> None:
        levels = ops.bits(blocks[:, :64], 2, 32).to(ops.torch.int16) - 1
        ops.scaled(out, levels, ops.fp16_field(blocks, 64))
'''

CHECK = '''
import sys
import gguf, gguf.quants, numpy as np, torch
from click.testing import CliRunner
from dflashkit.cli import convert_command, inspect_command, quantize_command
from dflashkit.release.arguments import parse_types
from dflashkit.runtime.kernels import dequantize_torch

hf, f16, out, converted = sys.argv[1:5]
run = CliRunner().invoke
print("quantize TYPE list:", "TQ2_0" in run(quantize_command, ["--help"]).output.replace("\\n", " "))
print("convert --outtype:", "tq2_0" in run(convert_command, ["--help"]).output)
print("release --types:", parse_types("tq2_0,q8_0"))
bad = run(quantize_command, [f16, out + ".x", "Q9_9"])
print("unknown TYPE lists it:", bad.exit_code, "TQ2_0" in bad.output)
r = run(quantize_command, [f16, out, "tq2_0", "--tensor-type", "attn_q=tq2_0", "-q"])
print("quantize:", r.exit_code, r.output.strip()[:200])
reader = gguf.GGUFReader(out)
print("file type:", int(reader.fields["general.file_type"].parts[-1][0]))
types = {t.name: t.tensor_type.name for t in reader.tensors}
print("types:", sorted(set(types.values())))
print("fallback (544-value rows):", types["blk.0.ffn_down.weight"])
t = next(t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.TQ2_0)
shape = tuple(int(s) for s in reversed(t.shape.tolist()))
ref = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
ours = dequantize_torch(torch.from_numpy(np.array(t.data)), "TQ2_0", shape).numpy()
print("torch dequantize == gguf-py:", np.array_equal(ref.view(np.uint32), ours.view(np.uint32)))
r = run(inspect_command, [out])  # a drafter converted without its target: no tokenizer, the one error
print("inspect:", r.exit_code, "TQ2_0       13" in r.output,
      [line.split()[1] for line in r.output.splitlines() if line.strip().startswith("error ")])
r = run(convert_command, [hf, converted, "--outtype", "tq2_0"])
print("convert:", r.exit_code, int(gguf.GGUFReader(converted).fields["general.file_type"].parts[-1][0]))
'''


def test_a_throwaway_type_is_one_module(tmp_path: Path) -> None:
    hf = make_drafters.make_drafter(tmp_path / "hf", "qwen3-b16", config_overrides={
        "hidden_size": 256, "intermediate_size": 544, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "num_hidden_layers": 2,
        "dflash_config": {"mask_token_id": 500, "target_layer_ids": [1, 3, 5, 7, 9]}})
    f16 = tmp_path / "in.gguf"
    convert(hf, f16, outtype="f16", progress=False, warn=lambda m: None)
    root = tmp_path / "pkg"
    shutil.copytree(PACKAGE, root / "dflashkit", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "dflashkit" / "codecs" / "types" / "tq2_0.py").write_text(THROWAWAY)
    (tmp_path / "check.py").write_text(CHECK)
    env = dict(os.environ, PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, str(tmp_path / "check.py"), str(hf), str(f16), str(tmp_path / "out.gguf"),
                        str(tmp_path / "converted.gguf")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "quantize TYPE list: True",
        "convert --outtype: True",
        "release --types: ['TQ2_0', 'Q8_0']",
        "unknown TYPE lists it: 2 True",
        "quantize: 0 ",
        "file type: 37",
        "types: ['F32', 'Q4_0', 'TQ2_0']",
        "fallback (544-value rows): Q4_0",
        "torch dequantize == gguf-py: True",
        "inspect: 1 True ['drafter.tokenizer_missing']",
        "convert: 0 37",
    ], r.stdout
