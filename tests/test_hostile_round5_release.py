"""Issue 47, hostile round 5 of the release and of serving: nothing of the machine published (the importance matrix's
path in every GGUF's metadata, llama-server's log lines in a stored crash message), builds told apart by their real
binary, the llama.cpp options shared with dflash-accept, and a CPU where llama-server crashes with ggml's weight
repacking (a stand-in that dies loading a drafter unless given ``--no-repack``, as ggml does on AMX): each figure
measured once more without repacking and labelled, and a type that crashed never recommended without a word."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import standin_server
from dflashkit.cli import accept_command, convert_command, release_command
from dflashkit.io.gguf_reader import open_gguf
from dflashkit.llama_cpp import NO_REPACK_NOTE
from dflashkit.release import check_release
from dflashkit.release.card import recommended, render_card
from imatrix_files import (entry_arrays, kv_string, kv_strings, kv_u32, kv_u64, weight_tensors, write_gguf_imatrix,
                           write_raw_imatrix)

pytestmark = pytest.mark.slow  # each test runs a whole release or accept with its stand-in servers

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
SMALL = ["--max-prompts", "2", "--max-new-tokens", "16", "--parity-rounds", "1", "--jobs", "1", "-q"]


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every input under a folder whose name appears nowhere but in this machine's paths, and the drafter's
    importance matrix there."""
    root = tmp_path_factory.mktemp("r5") / "PRIVATE-alice-7f3e91"
    src = Path(shutil.copytree(TRAINED / "drafter", root / "models" / "my-drafter"))
    target = Path(shutil.copytree(TRAINED / "target", root / "models" / "my-target"))
    base = root / "base.gguf"
    res = CliRunner().invoke(convert_command, [str(src), str(base), "--outtype", "f32", "--target", str(target), "-q"])
    assert res.exit_code == 0, res.output
    # llama-imatrix records its -f as typed: an absolute path of the machine
    im = write_gguf_imatrix(root / "drafter.imatrix.gguf", weight_tensors(base), dataset=str(root / "calib.txt"))
    target_gguf = root / "target.gguf"
    target_gguf.write_bytes(b"GGUF")  # the stand-in never reads it
    return {"root": root, "src": src, "target": target, "imatrix": im, "target_gguf": target_gguf}


def _release(p: dict[str, Path], out: Path, build: Path, *extra: str) -> object:
    return CliRunner().invoke(release_command, [
        str(p["src"]), str(out), "--target", str(p["target"]), "--types", "q8_0,q4_k_m", "--imatrix",
        str(p["imatrix"]), "--llama-server", str(build), "--target-gguf", str(p["target_gguf"]), *SMALL, *extra])


def _assert_nothing_private(out: Path, root: Path) -> None:
    for f in sorted(out.iterdir()):
        data = f.read_bytes()
        for secret in (b"PRIVATE-alice-7f3e91", str(root.parent).encode(), os.path.expanduser("~").encode() + b"/"):
            assert secret not in data, (f.name, secret)


def test_a_release_where_llama_server_crashes_with_repacking(private: dict[str, Path], tmp_path: Path) -> None:
    build = standin_server.make(private["root"] / "llama.cpp" / "build" / "bin", "amx-q8")
    out = tmp_path / "out"
    res = _release(private, out, build)
    assert res.exit_code == 0, res.output
    record = json.loads((out / "release.json").read_text())
    q8, q4 = (record["jobs"][t]["serving"] for t in ("Q8_0", "Q4_K_M"))
    # each type's speed-up measured: Q8_0 once more without repacking (both arms), and labelled
    assert [(e["verdict"], e["note"]) for e in q8] == [("net gain", NO_REPACK_NOTE)]
    assert [(e["verdict"], e["note"]) for e in q4] == [("net gain", None)]
    argvs = standin_server.argvs(build)
    assert sum("--no-repack" in a for a in argvs) == 2, argvs  # the retried pair: the target alone and with -md
    card = (out / "README.md").read_text()
    assert f"net gain ({NO_REPACK_NOTE})" in card
    for t in ("Q8_0", "Q4_K_M"):  # the matrix by its base name in every GGUF's metadata
        with open_gguf(out / record["jobs"][t]["file"]) as g:
            assert g.get("quantize.imatrix.file") == "drafter.imatrix.gguf"
            assert g.get("quantize.imatrix.dataset") == "calib.txt"
    _assert_nothing_private(out, private["root"])
    assert check_release(out) == []


def test_a_type_that_crashed_is_never_recommended_silently(private: dict[str, Path], tmp_path: Path) -> None:
    build = standin_server.make(private["root"] / "llama.cpp-b" / "build" / "bin", "segv-q8")
    out = tmp_path / "out"
    res = _release(private, out, build)
    assert res.exit_code == 0, res.output
    record = json.loads((out / "release.json").read_text())
    (crash,) = record["jobs"]["Q8_0"]["serving"]
    # llama-server's own log line named the drafter by its absolute path: stored by its base name
    assert crash["verdict"] == "crashed" and "loaded meta data from my-drafter-Q8_0.gguf" in crash["refused"]
    assert record["recommended"] == "Q4_K_M"
    _assert_nothing_private(out, private["root"])
    # by the τ rule (no net gain anywhere), the crashed Q8_0 is left out and the card says so
    for e in record["jobs"]["Q4_K_M"]["serving"]:
        e["verdict"], e["speedup_ci"] = "no gain", [0.5, 3.0]
    record["jobs"]["Q4_K_M"]["tau"]["mean"] = 0.5 * record["jobs"]["Q8_0"]["tau"]["mean"]  # below the τ rule's bar
    assert recommended(record) is None
    card = render_card({**record, "recommended_by": "τ"})
    assert "Not considered: Q8_0 — llama-server crashed on or refused the file" in card


def test_accept_retries_without_repacking_and_says_so(tmp_path: Path) -> None:
    build = standin_server.make(tmp_path / "bin", "amx")
    target_gguf = tmp_path / "t.gguf"
    target_gguf.write_bytes(b"GGUF")
    drafter = tmp_path / "drafter-bf16.gguf"
    res = CliRunner().invoke(convert_command, [str(TRAINED / "drafter"), str(drafter), "--outtype", "bf16", "--target",
                                               str(TRAINED / "target"), "-q"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(accept_command, [
        str(drafter), "--target", str(TRAINED / "target"), "--prompts", str(TRAINED / "prompts.jsonl"),
        "--max-prompts", "2", "--max-new-tokens", "16", "--llama-server", str(build), "--target-gguf",
        str(target_gguf), "--format", "json", "-q"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    rows = next(s["rows"] for s in report["sections"] if s.get("id") == "serving")
    assert [(r["verdict"], r["note"]) for r in rows] == [("net gain", NO_REPACK_NOTE)]
    assert any(NO_REPACK_NOTE in n for s in report["sections"] if s.get("id") == "serving_notes" for n in s["items"])


def test_the_shared_llama_cpp_options_reach_the_release_servers(private: dict[str, Path], tmp_path: Path) -> None:
    build = standin_server.make(tmp_path / "llama.cpp" / "build" / "bin")
    link = tmp_path / "same-build"
    link.symlink_to(build, target_is_directory=True)
    res = _release(private, tmp_path / "twice", build, "--llama-server", str(link))
    assert res.exit_code == 2 and "the same llama-server as --llama-server" in res.stderr, res.output
    assert not (tmp_path / "twice").exists()
    res = _release(private, tmp_path / "out", build, "--llama-cpp-arg=--no-repack", "--threads", "2",
                   "--llama-cpp-timeout", "120")
    assert res.exit_code == 0, res.output
    for argv in standin_server.argvs(build):
        assert "--no-repack" in argv and argv[argv.index("-t") + 1] == "2", argv


@pytest.mark.parametrize("case, message", [
    ("chunk_count UINT64", "imatrix.chunk_count is a UINT64, not a UINT32 — llama-quantize aborts on it"),
    ("no such file", "no such file (--imatrix)"),
])
def test_a_bad_imatrix_is_refused_before_any_work(private: dict[str, Path], tmp_path: Path, case: str,
                                                   message: str) -> None:
    im = tmp_path / "m.gguf"
    if case != "no such file":
        write_raw_imatrix(im, [kv_string("general.type", b"imatrix"), kv_strings("imatrix.datasets", [b"d"]),
                               kv_u64("imatrix.chunk_count", 2**33), kv_u32("imatrix.chunk_size", 16)],
                          entry_arrays([("fc.weight", 8)]))
    out = tmp_path / "out"
    res = CliRunner().invoke(release_command, [str(private["src"]), str(out), "--target", str(private["target"]),
                                               "--types", "q4_k_m", "--imatrix", str(im), "-q"])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and message in lines[0], res.stderr
    assert "internal error" not in res.stderr and not out.exists()


def test_scrubbed_messages_keep_no_path(tmp_path: Path) -> None:
    """Known paths first (they may hold spaces, ':' or brackets), then anything shaped like an absolute path."""
    from dflashkit.release.inputs import scrub_paths

    known = tmp_path / "user name" / "m (copy):v2" / "x.gguf"
    text = (f"llama_model_loader: loaded meta data from {known} | srv load_model: loading "
            f"'/home/alice/models/t.gguf' file:///home/alice/y.gguf PATH=/usr/bin:/home/alice/bin "
            "http://127.0.0.1:8080/health")
    out = scrub_paths(text, [known])
    assert out == ("llama_model_loader: loaded meta data from x.gguf | srv load_model: loading 't.gguf' "
                   "file://y.gguf PATH=bin:bin http://127.0.0.1:8080/health")
