"""dflash-release's serving step (issue 41): speed-ups timed alone — after every file job, one server pair at a
time, read back from timings.json and from the servers' own start times —, the figure whole in the card (speed-up
with its CI and verdict, τ both ways, acceptance rate, n-max, the best n-max of a sweep, two builds side by side),
the recommendation by speed-up, ``--check`` re-deriving every serving figure, the ecosystem's file names, and no
path of the machine in any published file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import standin_server
from dflashkit.accept.options import LlamaCppOptions, PromptOptions
from dflashkit.cli import release_command
from dflashkit.release import check_release, release

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
SMALL = {"prompt_options": PromptOptions(max_prompts=3, max_new_tokens=16), "parity_rounds": 2}


def _standin_builds(tmp: Path) -> list[Path]:
    """Two stand-in llama-server builds with names the card tells apart (the stand-in: ×2 speed with a drafter)."""
    return [standin_server.make(tmp / name / "bin") for name in ("llama-build-a", "llama-build-b")]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    tmp = tmp_path_factory.mktemp("served")
    builds = _standin_builds(tmp)
    target_gguf = tmp / "Qwen3-tiny-BF16.gguf"
    target_gguf.write_bytes(b"GGUF")  # the stand-in never reads it
    out = tmp / "release"
    release(TRAINED / "drafter", out, target=TRAINED / "target", types="bf16,q8_0,q4_0", workers=2,
            llama=LlamaCppOptions(llama_servers=tuple(str(b) for b in builds), target_ggufs=(str(target_gguf),),
                                  draft_n_max=(4, 15)), naming="target",
            target_name="Qwen3-tiny", **SMALL)
    return out, builds


def test_the_serving_step_runs_alone_after_every_job(served: tuple[Path, list[Path]]) -> None:
    out, builds = served
    timings = json.loads((out / "timings.json").read_text())
    jobs = [(j["started"], j["finished"]) for j in timings["jobs"].values()]
    serving = [(s["started"], s["finished"]) for s in timings["serving"]]
    assert timings["runner"] == "process pool of 2" and len(jobs) == 3
    assert len(serving) == 3 * 2  # every type, with each build
    last_job = max(end for _, end in jobs)
    assert all(start >= last_job for start, _ in serving)  # no timing beside a job
    ordered = sorted(serving)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ordered, ordered[1:]))  # nor beside another
    # the servers' own start times: every one started inside a serving interval, after the last job
    starts = [p.stat().st_mtime for b in builds for p in b.glob("argv-*")]
    assert len(starts) == 2 * (3 * 2 + 3)  # per build: 3 types × 2 n-max with the drafter, 3 targets alone
    assert all(any(s - 0.5 <= t <= e + 0.5 for s, e in serving) for t in starts) and min(starts) >= last_job - 0.5
    assert timings["host"] == json.loads((out / "release.json").read_text())["serving"]["host"]


def test_the_card_carries_the_figure_whole(served: tuple[Path, list[Path]]) -> None:
    out, _ = served
    record = json.loads((out / "release.json").read_text())
    card = (out / "README.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["dflash-Qwen3-tiny-BF16.gguf", "dflash-Qwen3-tiny-Q8_0.gguf", "dflash-Qwen3-tiny-Q4_0.gguf", "README.md",
         "SHA256SUMS", "release.json", "timings.json"])
    assert record["serving"]["builds"] == ["llama-build-a", "llama-build-b"]
    assert record["serving"]["draft_n_max"] == [4, 15]
    for t in ("BF16", "Q8_0", "Q4_0"):
        entries = record["jobs"][t]["serving"]
        assert [(e["build"], e["draft_n_max"]) for e in entries] == [
            ("llama-build-a", 4), ("llama-build-a", 15), ("llama-build-b", 4), ("llama-build-b", 15)]
        for e in entries:
            # the stand-in: ×2 on every prompt; n-max k drafts k a round and accepts all but the round's last
            assert e["speedup"] == pytest.approx(2.0) and e["verdict"] == "net gain"
            assert e["speedup_ci"] == pytest.approx([2.0, 2.0])
            rounds = -(-15 // (e["draft_n_max"] + 1))
            assert e["drafted"] == 3 * rounds * e["draft_n_max"] and e["accepted"] == 3 * (15 - rounds)
            assert e["acceptance_rate"] == e["accepted"] / e["drafted"]
            assert e["tau"] == pytest.approx(15 / rounds)
        file = record["jobs"][t]["file"]
        # the table row at the best n-max (a tie: the first listed), with its CI, verdict, τ and acceptance rate
        best = entries[0]
        assert (f"| `{file}` | `llama-build-a` | 4 | default | {best['tau']:.3f} | {best['acceptance_rate']:.1%} |"
                in card)
        assert f"| `{file}` | `llama-build-b` | 4 | default |" in card
        # the files table: τ through llama-server at the largest n-max served, the speed-up at the best
        longest = entries[1]
        assert (f"| {longest['tau']:.3f} (server, n-max 15) | ×2.00 \\[2.00, 2.00\\] net gain (n-max 4) | passed |"
                in card)
    # the sweep table, the host and the builds named
    assert "| llama.cpp τ | speed-up | gates |" in card
    assert "### Speed-up at each n-max" in card and "| file | llama.cpp build | n-max 4 | n-max 15 |" in card
    assert f"Measured on {record['serving']['host']} with llama.cpp `llama-build-a`, `llama-build-b`" in card
    # the smallest net gain whose CI overlaps the fastest: every type ties at ×2, so the smallest file
    assert record["recommended"] == "Q4_0" and record["recommended_by"] == "speed-up"
    assert "the smallest file that passed every gate whose speed-up through llama-server is a net gain" in card
    assert ("llama-server -m Qwen3-tiny-BF16.gguf -md dflash-Qwen3-tiny-Q4_0.gguf --spec-type draft-dflash "
            "--spec-draft-n-max 4\n") in card
    assert "`dflash-Qwen3-tiny-<TYPE>.gguf`, is the one ggml-org/convert gives a drafter" in card
    assert check_release(out) == []


def test_check_re_derives_every_serving_figure(served: tuple[Path, list[Path]], tmp_path: Path) -> None:
    from dflashkit.release.card import render_card
    from dflashkit.release.card import sha256sums

    def edited(change: object) -> list[str]:
        copy = Path(shutil.copytree(served[0], tmp_path / f"copy{len(list(tmp_path.iterdir()))}"))
        record = json.loads((copy / "release.json").read_text())
        change(record)  # type: ignore[operator]
        (copy / "release.json").write_text(json.dumps(record, indent=2) + "\n")
        (copy / "README.md").write_text(render_card(record))  # a consistent forgery of the card too
        names = [record["jobs"][t]["file"] for t in record["types"]] + ["README.md", "release.json"]
        (copy / "SHA256SUMS").write_text(sha256sums(copy, names))
        return check_release(copy)

    def faster(r: dict) -> None:
        r["jobs"]["Q8_0"]["serving"][1]["speedup"] = 2.5

    def slower_prompt(r: dict) -> None:
        r["jobs"]["Q8_0"]["serving"][1]["per_prompt_tokens_per_s"][0][0] /= 3

    def rate(r: dict) -> None:
        r["jobs"]["BF16"]["serving"][0]["acceptance_rate"] = 0.99

    def verdict(r: dict) -> None:
        r["jobs"]["BF16"]["serving"][0]["verdict"] = "no gain"

    def by(r: dict) -> None:
        r["recommended_by"] = "τ"

    (problem,) = edited(faster)
    assert "release.json: jobs.Q8_0.serving[1]: speed-up 2.5 [" in problem and "its per-prompt speeds give 2.0" in problem
    assert any("jobs.Q8_0.serving[1]: speed-up" in p for p in edited(slower_prompt))
    assert any("jobs.BF16.serving[0].acceptance_rate is 0.99, accepted / drafted give" in p for p in edited(rate))
    assert any("jobs.BF16.serving[0].verdict is no gain, its speed-up and CI give net gain" in p
               for p in edited(verdict))
    assert any("recommended_by is τ, its figures give speed-up" in p for p in edited(by))


def test_nothing_private_in_any_published_file(tmp_path: Path) -> None:
    # every input under a folder whose name appears nowhere but in this machine's paths: the drafter, the target,
    # the prompts, the llama.cpp build and the target GGUF
    private = tmp_path / "PRIVATE-alice-7f3e91"
    src = Path(shutil.copytree(TRAINED / "drafter", private / "models" / "my-drafter"))
    target = Path(shutil.copytree(TRAINED / "target", private / "models" / "my-target"))
    prompts = private / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n"
                               for i, t in enumerate(["the old king walks", "a river of glass"])))
    build = standin_server.make(private / "llama.cpp" / "build" / "bin")
    target_gguf = private / "target.gguf"
    target_gguf.write_bytes(b"GGUF")
    out = tmp_path / "out"
    res = CliRunner().invoke(release_command, [
        str(src), str(out), "--target", str(target), "--types", "q8_0", "--prompts", str(prompts),
        "--max-new-tokens", "16", "--parity-rounds", "2", "--llama-server", str(build), "--target-gguf",
        str(target_gguf), "--naming", "target", "--jobs", "1", "-q"])
    assert res.exit_code == 0, res.output
    published = sorted(p for p in out.iterdir())
    assert [p.name for p in published] == ["README.md", "SHA256SUMS", "dflash-my-target-Q8_0.gguf", "release.json",
                                           "timings.json"]
    for p in published:
        data = p.read_bytes()
        for secret in (b"PRIVATE-alice-7f3e91", str(tmp_path).encode(), os.environ.get("HOME", "/root").encode() + b"/"):
            assert secret not in data, (p.name, secret)
    record = json.loads((out / "release.json").read_text())
    assert (record["source"]["repo"], record["target"], record["serving"]["builds"]) == (
        "my-drafter", "my-target", ["llama.cpp/build"])
    assert check_release(out) == []


@pytest.mark.parametrize("args, message", [
    (["--llama-server", "{bin}"], "--llama-server needs the target as a GGUF: pass --target-gguf FILE"),
    (["--draft-n-max", "4"], "--draft-n-max / --draft-cache-type are how llama-server serves the files: give "
                             "--llama-server BIN_DIR too"),
    (["--llama-server", "{bin}", "--target-gguf", "{gguf}", "--draft-n-max", "16"],
     "--draft-n-max 16: drafter drafts at most 15 tokens a round"),
    (["--llama-server", "{bin}", "--llama-server", "{bin2}", "--target-gguf", "{gguf}"],
     "the card would name it llama-build-a, as it names"),
    (["--target-name", "Qwen3"], "--target-name names the files after the target: use it with --naming target"),
    (["--naming", "target", "--target-name", "../etc"], "--target-name '../etc': give the target's name as letters"),
])
def test_serving_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    bin_a = standin_server.make(tmp_path / "llama-build-a" / "bin")
    bin_b = standin_server.make(tmp_path / "other" / "llama-build-a")
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF")
    argv = [str(TRAINED / "drafter"), str(tmp_path / "out"), "--target", str(TRAINED / "target"),
            *(a.format(bin=bin_a, bin2=bin_b, gguf=gguf) for a in args)]
    res = CliRunner().invoke(release_command, argv)
    assert res.exit_code == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "out").exists() and standin_server.pids(bin_a) == []
