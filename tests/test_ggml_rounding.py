"""A llama.cpp GGUF's matmul as ggml's CPU backend computes it, against ggml itself (``libggml-cpu.so`` of each
pinned build, which .ci/run builds): `dflashkit.runtime.ggml_rounding`'s table of activation types is ggml's own
(``ggml_get_type_traits_cpu``), its rounded activations are exactly what ggml's ``from_float`` writes (Q8_0, Q8_1,
Q8_K, F16, BF16, and Q8_1's block sums), and a weight row times them is ggml's ``vec_dot`` within float32 summation
— where multiplying the float32 activations is off by the activation rounding. Then a Q4_1 drafter loaded from a
GGUF multiplies every matrix as ``vec_dot`` does.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashkit.codecs import dequantize, quantize
from dflashkit.runtime.ggml_rounding import VEC_DOT_TYPES, round_activations, round_q8_1, vec_dot_type
from llama_cpp_oracle import BIN_VARS, ggml_library
from test_quantize_properties import FAMILIES, _make

Q = GGMLQuantizationType
WEIGHT_TYPES = [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                Q.IQ4_NL, Q.IQ4_XS]
BUILDS = list(BIN_VARS)
N = 1024  # whole blocks of every type
TRAINED = Path(__file__).resolve().parents[1] / "fixtures" / "trained"
_SCALE = int(os.environ.get("DFLASHKIT_HYPOTHESIS_SCALE", "1"))
LIVE = settings(max_examples=20 * _SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _Traits(ctypes.Structure):  # ggml-cpu.h: struct ggml_type_traits_cpu (both builds)
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


def ggml_cpu(build: str) -> ctypes.CDLL:
    """``build``'s libggml-cpu, its type traits typed, its F16 tables initialised, and libggml-base's
    ``ggml_row_size`` beside it as ``row_size``."""
    cdll = ggml_library(build, "libggml-cpu.so")
    cdll.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_Traits)
    cdll.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    cdll.ggml_cpu_init()  # the F16 tables the converters read (ggml initialises them once)
    base = ggml_library(build, "libggml-base.so")
    base.ggml_row_size.restype, base.ggml_row_size.argtypes = ctypes.c_size_t, [ctypes.c_int, ctypes.c_int64]
    cdll.row_size = base.ggml_row_size  # type: ignore[attr-defined]
    return cdll


def traits(lib: ctypes.CDLL, t: int) -> _Traits:
    return lib.ggml_get_type_traits_cpu(int(t)).contents


def to_vec_dot_type(lib: ctypes.CDLL, kind: Q, x: np.ndarray) -> np.ndarray:
    """ggml's ``from_float`` of ``kind`` on the float32 row ``x``: the bytes ``mul_mat`` multiplies."""
    # (ggml's own size: gguf-py still lists Q8_1 at 40 bytes, the F32 d and s it once had; ggml's is 36)
    out = np.zeros(lib.row_size(int(kind), x.size), np.uint8)
    _FROM_FLOAT(traits(lib, kind).from_float)(x.ctypes.data, out.ctypes.data, x.size)
    return out


def decode(kind: Q, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(the activation values, Q8_1's stored block sums) of ``from_float`` bytes; numpy reads the formats directly
    (gguf-py has no Q8_1 / Q8_K codec): Q8_0 = F16 d + 32 int8, Q8_1 = F16 d, F16 s + 32 int8, Q8_K = F32 d +
    256 int8 + 16 int16 sums."""
    if kind == Q.F16:
        return raw.view(np.float16).astype(np.float32), None
    if kind == Q.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32), None
    if kind == Q.Q8_0:
        b = raw.reshape(-1, 34)
        return (b[:, 2:].view(np.int8) * b[:, :2].copy().view(np.float16).astype(np.float32)).reshape(-1), None
    if kind == Q.Q8_1:
        b = raw.reshape(-1, 36)
        d, s = (b[:, i:i + 2].copy().view(np.float16).astype(np.float32) for i in (0, 2))
        return (b[:, 4:].view(np.int8) * d).reshape(-1), s[:, 0]
    b = raw.reshape(-1, 292)
    return (b[:, 4:260].view(np.int8) * b[:, :4].copy().view(np.float32)).reshape(-1), None


def ggml_dot(lib: ctypes.CDLL, t: Q, w_row: np.ndarray, act: np.ndarray, n: int = N) -> float:
    """ggml's ``vec_dot`` of type ``t``: a stored weight row times ``from_float``'s activation row (``n`` values)."""
    s = np.zeros(1, np.float32)
    _VEC_DOT(traits(lib, t).vec_dot)(n, s.ctypes.data, 0, w_row.ctypes.data, 0, act.ctypes.data, 0, 1)
    return float(s[0])


def weight_row(t: Q, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(the row's bytes as a GGUF stores it, its float32 values)."""
    w = rng.standard_normal((1, N)).astype(np.float32) * 0.05
    raw = quantize(w, t).reshape(-1)  # byte-identical to ggml_quantize_chunk (tests/test_quantize_ggml_live.py)
    return raw, np.asarray(dequantize(raw, t), dtype=np.float32).reshape(-1)


@pytest.mark.parametrize("build", BUILDS)
def test_the_activation_type_table_is_ggmls(build: str) -> None:
    lib = ggml_cpu(build)
    for t in WEIGHT_TYPES + [Q.F32]:
        assert vec_dot_type(t.name) == (None if t == Q.F32 else Q(traits(lib, t).vec_dot_type).name), t.name
    assert {k: v for k, v in VEC_DOT_TYPES.items() if k in Q.__members__} == {
        k: Q(traits(lib, Q[k]).vec_dot_type).name for k in VEC_DOT_TYPES if k in Q.__members__}


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("kind", [Q.F16, Q.BF16, Q.Q8_0, Q.Q8_1, Q.Q8_K])
@LIVE
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-6.0, 4.0))
def test_rounded_activations_are_ggmls_bytes(build: str, kind: Q, family: str, seed: int,
                                             log_scale: float) -> None:
    lib = ggml_cpu(build)
    x = np.ascontiguousarray(_make(family, seed, 1, N, log_scale)[0], dtype=np.float32)
    values, sums = decode(kind, to_vec_dot_type(lib, kind, x))
    ours = round_activations(torch.from_numpy(x), kind.name).numpy()
    assert np.array_equal(ours, values), f"{kind.name} {family}"  # (−0 and 0 multiply alike)
    if kind == Q.Q8_1:  # the block sums ggml multiplies a Q4_1 / Q5_1 minimum with
        assert np.array_equal(round_q8_1(torch.from_numpy(x))[1].numpy() + values.reshape(-1, 32).sum(-1),
                              sums)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_a_weight_row_times_the_rounded_activations_is_ggmls_dot(build: str, t: Q) -> None:
    lib = ggml_cpu(build)
    rng = np.random.default_rng(int(t))
    kind = Q[vec_dot_type(t.name)]  # type: ignore[misc]
    emulated_err, plain_err = [], []
    for _ in range(24):
        raw, w = weight_row(t, rng)
        x = (rng.standard_normal(N) * rng.uniform(0.1, 10)).astype(np.float32)
        got = ggml_dot(lib, t, raw, to_vec_dot_type(lib, kind, x))
        xt = torch.from_numpy(x)
        emulated = float(np.dot(w.astype(np.float64), round_activations(xt, kind.name).numpy().astype(np.float64)))
        if kind == Q.Q8_1:  # the weight's block minimums (F16 at bytes 2–3 of each block) meet the block sums
            block = GGML_QUANT_SIZES[t][1]
            mins = raw.reshape(-1, block)[:, 2:4].copy().view(np.float16).astype(np.float64)[:, 0]
            emulated += float(np.dot(mins, round_q8_1(xt)[1].numpy().astype(np.float64)))
        scale = float(np.abs(w).astype(np.float64) @ np.abs(x).astype(np.float64))
        emulated_err.append(abs(got - emulated) / scale)
        plain_err.append(abs(got - float(np.dot(w.astype(np.float64), x.astype(np.float64)))) / scale)
    # float32 accumulation in another order is all that is left: ~1e-7 of Σ|w·x|
    assert max(emulated_err) < 2e-6, (t.name, max(emulated_err))
    # and the float32 activations are measurably off it (the F16 / BF16 / Q8 rounding)
    assert np.median(plain_err) > 10 * np.median(emulated_err), (t.name, np.median(plain_err))


@pytest.fixture(scope="module")
def trained_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The trained fixture drafter as llama.cpp GGUFs: BF16 (converted), Q8_0, Q4_1 and Q4_K_M (quantized)."""
    from dflashkit.converters.convert import convert
    from dflashkit.quantize.gguf_file import quantize_gguf

    root, trained = tmp_path_factory.mktemp("ggml-rounding"), TRAINED
    quiet: dict = dict(progress=False, warn=lambda m: None)
    files = {"BF16": root / "bf16.gguf", "F32": root / "f32.gguf"}
    convert(trained / "drafter", files["BF16"], outtype="bf16", target=trained / "target", **quiet)
    convert(trained / "drafter", files["F32"], outtype="f32", target=trained / "target", **quiet)
    for t in ("Q8_0", "Q4_1", "Q4_K_M"):
        files[t] = root / f"{t}.gguf"
        quantize_gguf(files["F32"], files[t], t, **quiet)
    return files


#: runtime module → the GGUF tensor it multiplies (Q4_K_M keeps blk.1.ffn_down in Q6_K)
MODULES = {"fc": "fc.weight", "layers.0.self_attn.q_proj": "blk.0.attn_q.weight",
           "layers.1.mlp.down_proj": "blk.1.ffn_down.weight", "layers.1.self_attn.v_proj": "blk.1.attn_v.weight"}


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("file_type", ["F32", "BF16", "Q8_0", "Q4_1", "Q4_K_M"])
def test_a_loaded_drafter_multiplies_as_ggml(build: str, file_type: str,
                                            trained_ggufs: dict[str, Path]) -> None:
    """Each matrix of a loaded llama.cpp GGUF against ``vec_dot`` of its own stored rows: the loader sets the
    activation type (and Q4_1's block minimums) from the file; ``ggml_activations=False`` multiplies float32."""
    from gguf import GGUFReader

    from dflashkit.runtime import load_drafter

    lib = ggml_cpu(build)
    path = trained_ggufs[file_type]
    model, plain = load_drafter(path), load_drafter(path, ggml_activations=False)
    assert any("as ggml's CPU backend rounds them" in n for n in model.load_info.notes) == (file_type != "F32")
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    rng = np.random.default_rng(7)
    for name, tensor_name in MODULES.items():
        t = tensors[tensor_name]
        x = (rng.standard_normal((3, int(t.shape[0]))) * 2).astype(np.float32)
        got = model.get_submodule(name)(torch.from_numpy(x)).numpy()
        flt = plain.get_submodule(name)(torch.from_numpy(x)).numpy()
        want, scale = ggml_products(lib, t, x)
        kind = vec_dot_type(Q(int(t.tensor_type)).name)
        for i in range(x.shape[0]):
            assert np.max(np.abs(got[i] - want[i]) / scale[i]) < 2e-6, (file_type, name, t.tensor_type.name)
            if kind is not None:  # float32 activations are off ggml by the activation rounding
                assert np.max(np.abs(flt[i] - want[i]) / scale[i]) > 1e-5, (file_type, name, t.tensor_type.name)


def ggml_products(lib: ctypes.CDLL, t: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``x`` [n, K] times every stored row of the GGUF tensor ``t`` as ggml's ``vec_dot`` takes them, after
    ``from_float`` to the row type's ``vec_dot_type``; Σ|w·x| per product, the scale of float32 order)."""
    wtype = Q(int(t.tensor_type))
    rows = np.ascontiguousarray(np.asarray(t.data).view(np.uint8).reshape(int(t.shape[1]), -1))
    w = np.stack([np.asarray(dequantize(r, wtype), dtype=np.float64).reshape(-1) for r in rows])
    kind = vec_dot_type(wtype.name)
    want = []
    for row in x:
        row = np.ascontiguousarray(row)
        act = row if kind is None else to_vec_dot_type(lib, Q[kind], row)
        want.append([ggml_dot(lib, wtype, r, act, x.shape[1]) for r in rows])
    return np.array(want), np.abs(x).astype(np.float64) @ np.abs(w).T


@pytest.mark.parametrize("build", BUILDS)
def test_an_own_token_embd_as_head_multiplies_as_ggml(build: str, tmp_path: Path) -> None:
    """A drafter with its own token_embd and no output uses that table as its head (llama.cpp 0.3.36): the head
    multiplies as any matrix of the table's type — for Q4_1 with its block minimums against Q8_1's block sums."""
    pytest.importorskip("dflash.model")
    from gguf import GGUFReader

    import make_zoo
    from dflashkit.converters.convert import convert
    from dflashkit.quantize.gguf_file import quantize_gguf
    from dflashkit.runtime import load_drafter
    from hostile import rewrite_gguf

    lib = ggml_cpu(build)
    target, made = make_zoo.make_zoo(tmp_path / "zoo", ["zlab-self-contained"])
    quiet: dict = dict(progress=False, warn=lambda m: None)
    convert(made["zlab-self-contained"], tmp_path / "f32.gguf", outtype="f32", target=target, **quiet)
    quantize_gguf(tmp_path / "f32.gguf", tmp_path / "q4_1.gguf", "Q4_1", **quiet)
    path = rewrite_gguf(tmp_path / "q4_1.gguf", tmp_path / "tied.gguf", drop_tensors=("output.weight",))
    embd = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    assert embd.tensor_type == Q.Q4_1
    head = load_drafter(path).lm_head
    assert head.activation_type == "Q8_1" and head.block_mins is not None
    x = (np.random.default_rng(11).standard_normal((3, int(embd.shape[0]))) * 2).astype(np.float32)
    want, scale = ggml_products(lib, embd, x)
    got = head(torch.from_numpy(x)).numpy()
    assert np.max(np.abs(got - want) / scale) < 2e-6


def test_parity_rounds_as_llama_cpp_unless_told_float(trained_ggufs: dict[str, Path]) -> None:
    """dflash-parity CHECKPOINT FILE.gguf measures the file as llama.cpp multiplies it, and says so;
    --float-activations leaves the weights' own rounding alone in the figures."""
    import json

    from click.testing import CliRunner

    from dflashkit.cli.parity import parity_command

    trained = TRAINED
    args = [str(trained / "drafter"), str(trained_ggufs["Q4_K_M"]), "--target", str(trained / "target"),
            "--skip-weights", "--format", "json"]
    runs = {flag: CliRunner().invoke(parity_command, args + ([flag] if flag else []))
            for flag in ("", "--float-activations")}
    reports = {flag: json.loads(r.stdout) for flag, r in runs.items()}
    assert all(r.exit_code == 0 for r in runs.values()), {f: r.output for f, r in runs.items()}
    said = {flag: "rounded before each matmul as ggml's CPU backend rounds them" in r.stdout
            for flag, r in runs.items()}
    assert said == {"": True, "--float-activations": False}
    assert reports[""]["summary"]["kl"] != reports["--float-activations"]["summary"]["kl"]
