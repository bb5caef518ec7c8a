"""dflash-release (issue 32): the trained pair released as six types — files byte-identical to the single commands,
a model card huggingface_hub reads back, checksums ``sha256sum -c`` accepts, release.json; the same files and
figures from a process pool and from Ray; resumed after a kill; ``--check`` on a changed byte, a missing file and an
edited figure; a planted defect marked (or refused, naming the type and the gate)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import hostile
from dflashkit.cli import convert_command, quantize_command
from dflashkit.cli_release import release_command
from dflashkit.errors import DFlashError
from dflashkit.release import DEFAULT_TYPES, check_release, release

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
SMALL = {"max_prompts": 3, "max_new_tokens": 16, "parity_rounds": 2}  # every figure, kept quick
CLI_SMALL = ["--max-prompts", "3", "--max-new-tokens", "16", "--parity-rounds", "2"]


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rel") / "release"
    release(TRAINED / "drafter", out, target=TRAINED / "target", workers=1, **SMALL)
    return out


def test_six_files_as_the_single_commands_write_them(sequential: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    base = tmp_path / "base.gguf"
    res = runner.invoke(convert_command, [str(TRAINED / "drafter"), str(base), "--outtype", "f32", "--target",
                                          str(TRAINED / "target"), "-q"])
    assert res.exit_code == 0, res.output
    names = []
    for t in DEFAULT_TYPES:
        single = tmp_path / f"{t}.gguf"
        res = runner.invoke(quantize_command, [str(base), str(single), t.lower(), "-q"])
        assert res.exit_code == 0, res.output
        assert (sequential / f"drafter-{t}.gguf").read_bytes() == single.read_bytes(), t
        names.append(f"drafter-{t}.gguf")
    assert sorted(p.name for p in sequential.iterdir()) == sorted([*names, "README.md", "SHA256SUMS",
                                                                   "release.json", "timings.json"])


def test_the_card_the_checksums_and_the_record(sequential: Path) -> None:
    from huggingface_hub import ModelCard

    card = ModelCard.load(sequential / "README.md")
    assert card.data.base_model == "drafter" and card.data.base_model_relation == "quantized"
    assert {"gguf", "speculative-decoding"} <= set(card.data.tags) and card.data.library_name == "gguf"
    done = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=sequential, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.count(": OK") == 8, done.stdout + done.stderr
    record = json.loads((sequential / "release.json").read_text())
    assert record["complete"] and record["types"] == list(DEFAULT_TYPES)
    for t in DEFAULT_TYPES:
        job = record["jobs"][t]
        assert job["file"] == f"drafter-{t}.gguf" and job["gates_failed"] == []
        assert job["size_bytes"] == (sequential / job["file"]).stat().st_size
        assert len(job["tau"]["per_prompt"]) == 3 and job["tau"]["mean"] > 2  # a trained pair: a real τ
        assert f"| `{job['file']}` | {job['size_bytes'] / 1e6:.2f} MB |" in card.text  # the row of each type
    assert record["jobs"]["BF16"]["parity"]["top1"] == 1.0  # BF16 of a BF16 checkpoint: the same drafter
    best = record["recommended"]
    assert f"llama-server -m target.gguf -md drafter-{best}.gguf --spec-type draft-dflash --spec-draft-n-max 15" \
        in card.text
    assert check_release(sequential) == []


def test_a_process_pool_gives_the_same_files_and_figures(sequential: Path, tmp_path: Path) -> None:
    out = tmp_path / "pool"
    release(TRAINED / "drafter", out, target=TRAINED / "target", workers=2, **SMALL)
    _same_release(sequential, out)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray (pip install -e '.[ray]')")
def test_ray_gives_the_same_files_and_figures(sequential: Path, tmp_path: Path) -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        out = tmp_path / "ray"
        result = release(TRAINED / "drafter", out, target=TRAINED / "target", ray="local", **SMALL)
        assert result.record["complete"] and len(result.ran) == 6
    finally:
        ray.shutdown()
    _same_release(sequential, out)
    assert json.loads((out / "timings.json").read_text())["runner"] == "ray"


def _same_release(a: Path, b: Path) -> None:
    """Every file byte for byte (release.json and the card included: every figure), timings.json aside."""
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for p in a.iterdir():
        if p.name != "timings.json":
            assert p.read_bytes() == (b / p.name).read_bytes(), p.name


def test_a_killed_release_resumes_without_redoing_finished_jobs(tmp_path: Path) -> None:
    out = tmp_path / "release"
    args = [str(TRAINED / "drafter"), str(out), "--target", str(TRAINED / "target"), "--jobs", "1", *CLI_SMALL]
    code = "from dflashkit.cli_release import release_command; release_command()"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if len(json.loads((out / "release.json").read_text())["jobs"]) >= 2:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = list(json.loads((out / "release.json").read_text())["jobs"])
    assert 2 <= len(finished) < 6 and not (out / "README.md").exists()
    res = CliRunner().invoke(release_command, args)
    assert res.exit_code == 0, res.output
    started = [line.split(":")[0] for line in res.stderr.splitlines() if line.endswith(": started")]
    kept = [line.split(":")[0] for line in res.stderr.splitlines() if ": kept (" in line]
    assert kept == finished and started == [t for t in DEFAULT_TYPES if t not in finished]
    assert check_release(out) == []


def test_ctrl_c_in_the_third_job_leaves_no_partial_file_and_resumes(tmp_path: Path) -> None:
    from interrupting import start_interrupted, wait_or_kill

    out = tmp_path / "release"
    args = [str(TRAINED / "drafter"), str(out), "--target", str(TRAINED / "target"), "--jobs", "1", "-q",
            *CLI_SMALL]
    # the signal lands inside the third quantize (the first is the shared F32 base's convert, not a quantize)
    proc = start_interrupted("release_command", args, "dflashkit.quantize.gguf_file:quantize_gguf", 3, 0.05,
                             cli_module="dflashkit.cli_release")
    rc, _, err = wait_or_kill(proc)
    assert rc == 130 and err.strip().endswith("interrupted (no output written)"), err
    record = json.loads((out / "release.json").read_text())
    assert list(record["jobs"]) == ["BF16", "Q8_0"] and not record["complete"]
    left = sorted(p.name for p in out.iterdir())
    assert left == [".dflash-release", "drafter-BF16.gguf", "drafter-Q8_0.gguf", "release.json"], left  # no part
    res = CliRunner().invoke(release_command, args)
    assert res.exit_code == 0 and check_release(out) == [], res.output


@pytest.fixture
def copy_of(sequential: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(sequential, tmp_path / "copy"))


def _check(folder: Path) -> tuple[int, list[str]]:
    res = CliRunner().invoke(release_command, ["--check", str(folder)])
    return res.exit_code, res.stderr.splitlines()


def test_check_finds_a_changed_byte(copy_of: Path) -> None:
    f = copy_of / "drafter-Q6_K.gguf"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    code, lines = _check(copy_of)
    assert code == 1 and lines[0] == f"error: {f}: its bytes changed since the release (sha256 differs from " \
                                      "release.json)"


def test_check_finds_a_missing_file(copy_of: Path) -> None:
    (copy_of / "drafter-Q8_0.gguf").unlink()
    code, lines = _check(copy_of)
    assert code == 1 and lines[0] == f"error: {copy_of / 'drafter-Q8_0.gguf'}: missing (type Q8_0)"


def test_check_finds_an_edited_figure(copy_of: Path) -> None:
    card = copy_of / "README.md"
    record = json.loads((copy_of / "release.json").read_text())
    tau = f"{record['jobs']['Q4_K_M']['tau']['mean']:.3f}"
    text = card.read_text().splitlines()
    row = next(i for i, line in enumerate(text) if line.startswith("| `drafter-Q4_K_M.gguf`"))
    text[row] = text[row].replace(f"| {tau} |", "| 9.999 |")
    card.write_text("\n".join(text) + "\n")
    code, lines = _check(copy_of)
    assert code == 1 and lines[0].startswith(f"error: {card}:{row + 1}: the card says ")
    assert "9.999" in lines[0] and tau in lines[0]


def _zero_fc_for(type_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted defect: ``type_name``'s file is written with ``fc.weight`` all zero (the others are intact)."""
    from dflashkit.quantize import gguf_file

    real = gguf_file.quantize_gguf

    def planted(src, out, file_type, **kwargs):  # type: ignore[no-untyped-def]
        result = real(src, out, file_type, **kwargs)
        if str(file_type).upper() == type_name:
            tmp = Path(str(out) + ".planted")
            zeros = np.zeros((256, 512), dtype=np.float32)  # fc: hidden x (taps x hidden) of the trained pair
            hostile.rewrite_gguf(Path(out), tmp, replace={"fc.weight": zeros})
            os.replace(tmp, out)
        return result

    monkeypatch.setattr(gguf_file, "quantize_gguf", planted)


def test_a_planted_defect_is_marked_in_the_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _zero_fc_for("Q6_K", monkeypatch)
    out = tmp_path / "release"
    result = release(TRAINED / "drafter", out, target=TRAINED / "target", types="bf16,q6_k", workers=1,
                     allow_failures=True, **SMALL)
    assert [(t, g["gate"]) for t, g in result.failures] == [("Q6_K", "parity")]
    row = next(line for line in (out / "README.md").read_text().splitlines() if "drafter-Q6_K.gguf" in line)
    assert row.startswith("| **`drafter-Q6_K.gguf`** |") and "**FAILED parity**: top-1 agreement" in row
    assert result.record["recommended"] == "BF16"


def test_a_planted_defect_without_allow_failures_names_the_type_and_gate(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _zero_fc_for("Q8_0", monkeypatch)
    out = tmp_path / "release"
    res = CliRunner().invoke(release_command, [str(TRAINED / "drafter"), str(out), "--target",
                                               str(TRAINED / "target"), "--types", "bf16,q8_0", "--jobs", "1", "-q",
                                               *CLI_SMALL])
    assert res.exit_code == 1
    assert res.stderr.startswith("error: Q8_0: the parity gate failed: top-1 agreement ")
    assert "< --min-top1 75.00% — no card written (--allow-failures writes it with the row marked)" in res.stderr
    assert not (out / "README.md").exists() and not (out / "SHA256SUMS").exists()


@pytest.mark.parametrize("args, message", [
    (["{src}", "{out}", "--types", "q3_k"], "--types q3_k: not a release type"),
    (["{src}", "{src}", "--target", "{target}"], "is inside the input"),
    (["--check", "{out}", "{out}"], "--check takes the release folder alone"),
    (["{src}", "{out}"], "--target DIR is required"),
])
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    src = shutil.copytree(TRAINED / "drafter", tmp_path / "drafter")
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    argv = [a.format(src=src, out=tmp_path / "out", target=TRAINED / "target") for a in args]
    if "--target" not in argv and "--check" not in argv and "required" not in message:
        argv += ["--target", str(TRAINED / "target")]
    res = CliRunner().invoke(release_command, argv)
    assert res.exit_code == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    assert not (tmp_path / "out").exists()


def test_a_check_of_a_folder_without_a_release(tmp_path: Path) -> None:
    with pytest.raises(DFlashError, match="no release.json — not a dflashkit release folder"):
        check_release(tmp_path)
