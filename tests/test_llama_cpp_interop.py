"""Optional interop with a real llama.cpp build: our files load and draft in llama.cpp (llama-server of both
pinned builds, 0.3.36 and mainline b11549), and dflash-quantize writes the same bytes as llama-quantize.

Needs llama.cpp's `llama-quantize` and `llama-speculative-simple` (the source ships in the
llama-cpp-python sdist; see docs/llama-cpp-checks.md). Point
DFLASHKIT_LLAMA_CPP_BIN at the folder holding them; without it these tests are skipped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import target_for
from dflashkit.converters.convert import convert
from dflashkit.quantize.gguf_file import quantize_gguf

import make_drafters
import make_target

BIN = Path(os.environ.get("DFLASHKIT_LLAMA_CPP_BIN", "/nonexistent"))
QUANTIZE = BIN / "llama-quantize"
SPECULATIVE = BIN / "llama-speculative-simple"
# .ci/run sets DFLASHKIT_LLAMA_CPP_SKIP_REASON (one line) when it could not build llama.cpp
pytestmark = pytest.mark.skipif(
    not (QUANTIZE.exists() and SPECULATIVE.exists()),
    reason=os.environ.get("DFLASHKIT_LLAMA_CPP_SKIP_REASON")
    or "set DFLASHKIT_LLAMA_CPP_BIN to a llama.cpp build with llama-quantize and llama-speculative-simple",
)
QUIET = dict(progress=False, warn=lambda m: None)


def speculative(target: Path, drafter: Path, want: str,
                spec_type: str = "draft-dflash") -> subprocess.CompletedProcess[str]:
    """Run llama-speculative-simple on a pair it refuses; rerun (at most 10 runs) while ``want`` (its reason) is
    missing from its stderr.

    llama.cpp's logger writes from a worker thread and is deliberately never flushed at exit
    (common/log.cpp, common_log_main: "this design may cause logs to be lost"), so on a busy machine a
    run can lose its last lines, the reason among them. A lost log is a rerun, never a pass: every run
    must still exit as expected, and the assertions read the run that printed ``want``. (Counts are never
    read from this log: `served` reads them from llama-server's JSON.) One thread: ggml's threads spin while they wait, so two threads on a loaded 2-core
    machine run many times slower (dflashkit.llama_cpp runs it the same way)."""
    for _ in range(10):
        r = subprocess.run(
            [str(SPECULATIVE), "-m", str(target), "-md", str(drafter), "--spec-type", spec_type,
             "--spec-draft-n-max", "15", "-p", "hello world", "-n", "8", "--temp", "0", "-t", "1", "-c", "256"],
            capture_output=True, text=True, errors="replace", timeout=300,
        )
        if want in r.stderr:
            break
    return r


#: the pinned builds a drafter must load and draft in (tests/test_serving.py BUILDS: their bin/ folders)
BUILD_BINS = {"0.3.36": "DFLASHKIT_LLAMA_CPP_BIN", "b11549": "DFLASHKIT_LLAMA_CPP_MAINLINE_BIN"}


@pytest.fixture(params=list(BUILD_BINS))
def server_bin(request: pytest.FixtureRequest) -> Path:
    folder = Path(os.environ.get(BUILD_BINS[request.param], "/nonexistent"))
    if not (folder / "llama-server").exists():
        pytest.skip(f"set {BUILD_BINS[request.param]} to the bin/ folder of the llama.cpp {request.param} build with "
                    "llama-server (.ci/run builds it)")
    return folder


def served(bin_dir: Path, target: Path, drafter: Path) -> tuple[int, str]:
    """One greedy completion through llama-server with the drafter: (draft tokens, the server's log so far). The
    count comes from the reply's JSON (it cannot be lost as speculative-simple's last log lines can); the load-time
    lines read here were written long before, while the server still runs."""
    from dflashkit.llama_cpp.server import LlamaServer

    with LlamaServer(bin_dir, target, drafter, draft_max=15, ctx_size=256) as server:
        c = server.complete("hello world", 8)
        return c.draft_n, server.output


@pytest.mark.parametrize("family", list(make_drafters.FAMILIES))
def test_llama_cpp_loads_and_drafts(family: str, drafters, targets, server_bin: Path, tmp_path: Path) -> None:
    target = target_for(family, targets)
    out = tmp_path / "d.gguf"
    convert(drafters[family], out, outtype="q8_0", target=target, **QUIET)
    drafted, log = served(server_bin, target, out)
    assert drafted > 0
    assert f"mask_token_id={make_drafters.FAMILIES[family]['dflash_config']['mask_token_id']}" in log


#: every type drafters ship in beyond Q8_0 (issue 40)
NEW_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS"]


@pytest.mark.slow
@pytest.mark.parametrize("family", list(make_drafters.FAMILIES))
def test_llama_cpp_loads_and_drafts_every_new_type(family: str, drafters, targets, server_bin: Path,
                                                   tmp_path: Path) -> None:
    target = target_for(family, targets)
    f32 = tmp_path / "f32.gguf"
    convert(drafters[family], f32, outtype="f32", target=target, **QUIET)
    refused = []
    for ftype in NEW_TYPES:
        out = tmp_path / f"d-{ftype}.gguf"
        quantize_gguf(f32, out, ftype, **QUIET)
        drafted, _ = served(server_bin, target, out)
        if drafted <= 0:
            refused.append(ftype)
    assert refused == [], f"{family}: drafted nothing as {refused}"


def test_llama_cpp_refuses_a_drafter_without_tokenizer(drafters, targets, tmp_path: Path) -> None:
    # the failure dflash-convert warns about when --target is missing
    out = tmp_path / "bare.gguf"
    convert(drafters["qwen3-b16"], out, outtype="bf16", **QUIET)
    r = speculative(targets[64]["gguf"], out, want="key not found in model")
    assert r.returncode != 0
    assert "key not found in model: tokenizer.ggml.model" in r.stderr


@pytest.mark.parametrize("family", ["qwen3-b16", "gemma4", "dflash2"])
@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K"])
def test_quantize_is_byte_identical_to_llama_quantize(family: str, ftype: str, tmp_path: Path) -> None:
    # 256-wide rows for the K-quants proper; the 64/72-wide fixtures exercise the fallbacks
    overrides = {}
    if family == "qwen3-b16":
        overrides = dict(hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=5,
                         dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 3, 5, 7, 9]})
    src = make_drafters.make_drafter(tmp_path / "d", family, config_overrides=overrides)
    f16 = tmp_path / "in.gguf"
    convert(src, f16, outtype="bf16", **QUIET)
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    quantize_gguf(f16, ours, ftype, **QUIET)
    r = subprocess.run([str(QUANTIZE), str(f16), str(ref), ftype], capture_output=True, text=True, errors="replace", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert ours.read_bytes() == ref.read_bytes()


def test_tap_past_the_last_layer_aborts_llama_cpp_and_inspect_says_why(drafters, targets, tmp_path: Path) -> None:
    from dflashkit.inspect import inspect_paths

    # same tokenizer as the 12-layer target the drafter was made for, but only 8 layers
    short = make_target.make_gguf_target(
        tmp_path / "short.gguf", make_target.make_hf_target(tmp_path / "short", hidden_size=64, n_layers=8)
    )
    out = tmp_path / "d.gguf"
    convert(drafters["qwen3-b16"], out, outtype="bf16", target=targets[64]["gguf"], **QUIET)  # taps stored [2, 9]
    r = speculative(short, out, want="GGML_ASSERT")
    assert r.returncode != 0 and "GGML_ASSERT" in r.stderr
    report = inspect_paths([str(out)], target=str(short))
    assert "target.tap_range" in {f.id for f in report.files[0].findings}
    assert report.exit_code() == 1


# ---- the drafter zoo (fixtures/make_zoo.py): every family that converts loads and drafts --------------

#: zoo fixtures dflashkit refuses on purpose (tests/test_speculators_dflash.py and the DSpark tests say why)
REFUSED = {"spec-dspark-gated", "specforge-dspark-gated", "qwen3-dspark-d2t-dup", "deepseekv4-dspark"}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    pytest.importorskip("dflash.model")
    pytest.importorskip("speculators.models.dspark")
    import make_zoo

    root = tmp_path_factory.mktemp("zoo")
    target_dir, made = make_zoo.make_zoo(root, [n for n in make_zoo.FIXTURES if n not in REFUSED])
    return make_target.make_gguf_target(root / "target.gguf", target_dir), made, target_dir


def _zoo_names() -> list[str]:
    import make_zoo

    return [n for n in make_zoo.FIXTURES if n not in REFUSED]


@pytest.mark.parametrize("name", _zoo_names())
def test_zoo_drafter_loads_and_drafts(name: str, zoo, server_bin: Path, tmp_path: Path) -> None:
    import make_zoo

    target, made, target_dir = zoo
    out = tmp_path / "d.gguf"
    # MiMo's mask_embedding.pt takes the target's embeddings and head from its HF dir; a config without
    # target_layer_ids gets them from --target-layer-ids (the fixture's taps)
    extra = {"target_layer_ids": make_zoo.TAPS} if name == "zlab-no-taps" else {}
    result = convert(made[name], out, outtype="q8_0", target=target_dir if name == "zlab-mimo" else target, **extra,
                     **QUIET)
    # llama.cpp tells DSpark from DFlash by the Markov head (common/speculative.cpp auto-detection); LlamaServer
    # passes the --spec-type the drafter's family declares: the same answer
    from dflashkit.llama_cpp.process import spec_type_of

    markov = any(t.gguf_name == "markov_w1.weight" for t in result.tensors)
    assert spec_type_of(out) == ("draft-dspark" if markov else "draft-dflash")
    drafted, log = served(server_bin, target, out)
    assert drafted > 0
    assert "mask_token_id=500" in log
    if name.startswith("spec-dflash"):  # speculators DFlash / DFlash 2: slot 0 is the anchor
        assert "sample_from_anchor=false" in log
    # issue 40: the two new layouts furthest from Q8_0 (2-bit super-blocks, non-linear levels) load and draft too
    for ftype in ("Q2_K", "IQ4_XS"):
        low = tmp_path / f"d-{ftype}.gguf"
        quantize_gguf(out, low, ftype, allow_requantize=True, **QUIET)
        assert served(server_bin, target, low)[0] > 0, ftype


def test_pre_merge_file_is_refused_and_its_translation_loads(drafters, targets, tmp_path: Path) -> None:
    from dflashkit.dialects import tap_ids_from_llama_cpp
    from gguf import GGUFValueType as V
    from test_inspect_drafter import rewrite_gguf

    target = targets[64]["gguf"]
    current = tmp_path / "current.gguf"
    convert(drafters["qwen3-b16"], current, outtype="q8_0", target=target, **QUIET)
    import gguf

    stored = [int(v) for v in gguf.GGUFReader(current).fields["dflash.target_layers"].contents()]
    pre = rewrite_gguf(
        current, tmp_path / "pre.gguf", drop_keys=("dflash.target_layers", "tokenizer.ggml.mask_token_id"),
        set_keys={"dflash.mask_token_id": (500, V.UINT32),
                  "dflash.target_layer_ids": (tap_ids_from_llama_cpp(stored), V.ARRAY, V.INT32)},
    )
    r = speculative(target, pre, want="requires 'target_layers'")
    assert r.returncode != 0 and "DFlash model requires 'target_layers' in GGUF metadata" in r.stderr
    fixed = tmp_path / "fixed.gguf"
    convert(pre, fixed, **QUIET)
    drafted, _ = served(BIN, target, fixed)
    assert drafted > 0
