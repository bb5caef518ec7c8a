"""Issue 56, hostile round 6: llama-quantize's dialect and data checks. ``--tensor-type`` repetition counts as
C++ std::regex (libstdc++) reads them — a count modulo 2^32, at most 100000 automaton states — and the data
llama-quantize refuses (NaN / ±inf in any tensor it reads, ±inf it would make: past F16 or BF16, an F16 block
scale). Each class plants its own cases and runs dflash-quantize as a user does, beside llama-quantize of both
pinned builds: its bytes where it succeeds, else one ``error:`` line and the exit code — naming the tensor
llama-quantize names — inputs byte-identical, nothing written."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import make_drafters
from contained import check_contained, run_contained
from dflashkit.converters.convert import convert
from dflashkit.io.gguf_reader import open_gguf
from dflashkit.quantize.gguf_file import quantize_gguf
from test_hostile_round5 import QUIET, WIDE, _llama_quantize_builds, _same_bytes_as_llama_quantize

pytestmark = pytest.mark.slow  # every case runs dflash-quantize as a child, beside llama-quantize of both builds


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 256-wide drafter as F32, F16 and BF16 GGUFs, and as Q8_0."""
    folder = tmp_path_factory.mktemp("round6")
    drafter = make_drafters.make_drafter(folder / "src", "qwen3-b16", config_overrides=WIDE)
    out = {}
    for outtype in ("f32", "f16", "bf16"):
        out[outtype] = folder / f"{outtype}.gguf"
        convert(drafter, out[outtype], outtype=outtype, **QUIET)
    out["q8_0"] = folder / "q8_0.gguf"
    quantize_gguf(out["f32"], out["q8_0"], "Q8_0", **QUIET)
    return out


def _plant(src: Path, dst: Path, values: dict[str, tuple[int, list[float]]]) -> Path:
    """A copy of ``src`` with, per tensor name, ``values`` stored from element (or, in a block type, the block's
    scale) number ``at`` on."""
    data = bytearray(src.read_bytes())
    with open_gguf(src) as g:
        for name, (at, planted) in values.items():
            info = g.tensors[name]
            if info.ggml_type.name == "Q8_0":  # the F16 scale d opens each 34-byte block
                raw, offset = np.array(planted, np.float16).tobytes(), info.offset + 34 * at
            elif info.ggml_type.name == "BF16":  # the top half of each float32
                raw = (np.array(planted, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
                offset = info.offset + 2 * at
            else:
                dtype = np.dtype({"F32": np.float32, "F16": np.float16}[info.ggml_type.name])
                raw, offset = np.array(planted, dtype).tobytes(), info.offset + dtype.itemsize * at
            data[offset : offset + len(raw)] = raw
    dst.write_bytes(bytes(data))
    return dst


def _llama_quantize_refuses(args: list, message: str) -> list[str]:
    """Run every pinned build's llama-quantize on ``args``; assert it fails with ``message``; the tensor each
    names (from its error, or the progress line of the tensor it failed on)."""
    named = []
    for build, binary in _llama_quantize_builds():
        proc = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and message in proc.stderr, (build, proc.stderr[-2000:])
        m = re.search(r"tensor '([^']+)' has invalid data", proc.stderr)
        progress = re.findall(r"\[\s*\d+/\s*\d+\]\s+(\S+)", proc.stdout + proc.stderr)
        named.append(m.group(1) if m else progress[-1] if progress else "")
    return named


def _refused(tmp: Path, args: list, message: str, code: int, inputs: list[Path]) -> str:
    """Run dflash-quantize ARGS contained: refused with ``code`` and one line holding ``message``; that line."""
    tmp.mkdir(parents=True, exist_ok=True)
    run = run_contained("quantize_command", [*args, "-q"], inputs=inputs, tmp=tmp / "run")
    check_contained(run, code, message, bounded=True)
    assert not Path(args[-2]).exists(), "an output was written"  # args: options, IN, OUT, TYPE
    return run.lines()[0]


# ---- --tensor-type: repetition as std::regex counts it ------------------------------------------------------------

@pytest.mark.parametrize("pattern, attention_type", [
    ("attn_q{0,4294967296}", "Q8_0"),  # a C int: {0,0}, so 'attn_' — every attention tensor
    ("attn_v{4294967295,7}", "Q8_0"),  # {-1,7}: no copy required, eight optional: 'attn_' again
    (r"blk\.0\.attn_(v){1}{1}", None),  # a repetition repeated: std::regex takes it, Python's re needs a group
    ("a{99993}", None),  # 100000 states: the largest count std::regex compiles
])
def test_repetition_counts_are_std_regex_s(sources: dict[str, Path], tmp_path: Path, pattern: str,
                                           attention_type: str | None) -> None:
    (tmp_path / "m.gguf").symlink_to(sources["bf16"])
    out = _same_bytes_as_llama_quantize(tmp_path, ["--tensor-type", f"{pattern}=q8_0", "m.gguf", "o.gguf", "q4_k_m"])
    if attention_type:
        with open_gguf(out) as g:
            assert g.tensors["blk.1.attn_k.weight"].ggml_type.name == attention_type


@pytest.mark.parametrize("pattern, message, theirs", [
    ("a{99994}", "makes 100001 automaton states", "Number of NFA states exceeds limit"),
    ("a{99999}", "refuses a pattern of more than 100000", "Number of NFA states exceeds limit"),
    ("(attn){60000}", "makes 420013 automaton states", "Number of NFA states exceeds limit"),
    ("[a-z]{1,99999}", "makes 200004 automaton states", "Number of NFA states exceeds limit"),
    ("attn_q{0,4294967295}", "reads its bounds as C ints (0 and -1) and refuses a maximum below the minimum",
     "Invalid range in '{}'"),
    ("^*attn", "the quantifier '*' after an assertion", "Mismatched '(' and ')'"),
])
def test_repetitions_std_regex_refuses(sources: dict[str, Path], tmp_path: Path, pattern: str, message: str,
                                       theirs: str) -> None:
    src = sources["bf16"]
    line = _refused(tmp_path, ["--tensor-type", f"{pattern}=q8_0", src, tmp_path / "q.gguf", "q4_k_m"], message, 2,
                    [src])
    assert line.startswith(f"error: --tensor-type '{pattern}=q8_0': bad regular expression ("), line
    _llama_quantize_refuses(["--tensor-type", f"{pattern}=q8_0", src, tmp_path / "theirs.gguf", "q4_k_m"], theirs)


# ---- data: refused where llama-quantize refuses it ----------------------------------------------------------------

INVALID, FAILED = "has invalid data", "quantized data validation failed"
DATA_CASES = {  # case: (source, {tensor: (at, values)}, TYPE and options, our words, llama-quantize's)
    "NaN and inf in a converted F32 weight": ("f32", {"blk.0.attn_q.weight": (5, [np.nan, np.nan, np.inf])},
                                              ["q4_k_m"], "has 3 NaN or infinite value(s)", INVALID),
    "NaN in an F32 norm it copies": ("f32", {"blk.0.attn_norm.weight": (3, [np.nan])}, ["q4_k_m"],
                                     "has 1 NaN or infinite value(s)", INVALID),
    "+inf in BF16": ("bf16", {"blk.1.ffn_up.weight": (7, [np.inf])}, ["q8_0"], "has 1 NaN or infinite", INVALID),
    "-inf in F16": ("f16", {"blk.1.attn_v.weight": (0, [-np.inf])}, ["q4_0"], "has 1 NaN or infinite", INVALID),
    "NaN in BF16 kept BF16": ("bf16", {"blk.0.attn_q.weight": (0, [np.nan])}, ["bf16"], "has 1 NaN", INVALID),
    "NaN in BF16 under --pure": ("bf16", {"blk.0.attn_q.weight": (0, [np.nan])}, ["q4_k_m", "--pure"], "has 1 NaN",
                                 INVALID),
    "a NaN scale in a Q8_0 tensor it copies": ("q8_0", {"blk.1.attn_k.weight": (3, [np.nan])}, ["q8_0"],
                                               "has 32 NaN or infinite value(s)", INVALID),
    "a NaN scale in a Q8_0 tensor it requantizes": ("q8_0", {"blk.1.attn_k.weight": (3, [np.nan])},
                                                    ["q4_0", "--allow-requantize"], "has 32 NaN", INVALID),
    "three tensors: the first in llama-quantize's order is named": (
        "f32", {"blk.1.attn_norm.weight": (0, [np.nan]), "blk.0.attn_q.weight": (0, [np.nan]),
                "fc.weight": (9, [np.inf])}, ["q4_0"], "tensor 'fc.weight' has 1 NaN or infinite value(s) (and 2 "
                                                        "more tensor(s))", INVALID),
    "a Q4_0 scale past F16": ("f32", {"blk.0.attn_q.weight": (0, [1e6] * 3)}, ["q4_0"],
                              "1 Q4_0 block(s) whose scale overflows F16", FAILED),
    "a Q8_0 scale past F16": ("f32", {"blk.0.attn_q.weight": (0, [1e7])}, ["q8_0"],
                              "1 Q8_0 block(s) whose scale overflows F16", FAILED),
    "F32 past F16": ("f32", {"blk.0.attn_q.weight": (0, [70000.0])}, ["f16"], "has 1 value(s) beyond ±65504", FAILED),
    "F32 past BF16": ("f32", {"blk.0.attn_q.weight": (0, [3.4e38])}, ["bf16"], "has 1 value(s) beyond BF16's",
                      FAILED),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_data_llama_quantize_refuses_is_refused(sources: dict[str, Path], tmp_path: Path, case: str) -> None:
    source, planted, (qtype, *options), ours, theirs = DATA_CASES[case]
    src = _plant(sources[source], tmp_path / "in.gguf", planted)
    named = _llama_quantize_refuses([*options, src, tmp_path / "theirs.gguf", qtype], theirs)
    line = _refused(tmp_path, [*options, src, tmp_path / "q.gguf", qtype], ours, 1, [src])
    assert line.startswith(f"error: {src}: tensor '") and line.endswith("or pass --allow-nonfinite to write it "
                                                                          "with a warning"), line
    assert all(line.startswith(f"error: {src}: tensor '{n}'") for n in named), (named, line)  # llama-quantize's
    strict = _refused(tmp_path / "strict", ["--strict", *options, src, tmp_path / "q.gguf", qtype], ours, 1, [src])
    assert strict == line  # --strict is the default, accepted


def test_allow_nonfinite_writes_them_with_a_warning(sources: dict[str, Path], tmp_path: Path) -> None:
    src = _plant(sources["f32"], tmp_path / "in.gguf", {"blk.0.attn_q.weight": (5, [np.nan, np.inf])})
    run = run_contained("quantize_command", [src, tmp_path / "q.gguf", "q8_0", "--allow-nonfinite"], inputs=[src],
                        tmp=tmp_path / "allow")
    check_contained(run, 0)
    assert "warning: blk.0.attn_q.weight: 2 NaN or infinite value(s), written as they are" in run.stderr
    assert (tmp_path / "q.gguf").is_file()
    _refused(tmp_path / "both", ["--strict", "--allow-nonfinite", src, tmp_path / "b.gguf", "q8_0"],
             "--strict and --allow-nonfinite contradict each other", 2, [src])


def test_a_scale_llama_quantize_keeps_is_written_as_its_bytes(sources: dict[str, Path], tmp_path: Path) -> None:
    _plant(sources["f32"], tmp_path / "m.gguf", {"blk.0.attn_q.weight": (0, [1e6])})  # 1e6/127 fits F16
    _same_bytes_as_llama_quantize(tmp_path, ["m.gguf", "o.gguf", "q8_0"])
