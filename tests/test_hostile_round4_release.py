"""Issue 39, dflash-release, ``--check`` and resume under hostile input, each case planted here and run as a user runs
it (`contained`): exit code, one ``error:`` line (``--check``: its first line), the inputs' and OUTDIR's foreign
files' bytes unchanged, nothing read or written outside OUTDIR, no process or temp folder left, under the memory
cap, and — where a loop was the defect — an end within its bound. The classes: user data, laundered figures, reads
outside OUTDIR, unbounded input, internal errors, signals and leftovers, card injection."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hostile
from contained import check_contained, fingerprint, run_contained
from test_hostile_round3 import pair  # noqa: F401  (a fixture: the trained pair and a target GGUF stand-in)

pytestmark = pytest.mark.slow  # every test runs dflash-release as a child

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
SMALL = ["--max-prompts", "2", "--max-new-tokens", "8", "--parity-rounds", "1", "-q"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Copies of the trained pair (a failed test must not touch the repository's fixtures)."""
    folder = tmp_path_factory.mktemp("inputs")
    return {"src": Path(shutil.copytree(TRAINED / "drafter", folder / "drafter")),
            "target": Path(shutil.copytree(TRAINED / "target", folder / "target"))}


def release_args(inputs: dict[str, Path], out: Path, *extra: object, types: str = "bf16,q8_0") -> list[str]:
    return [str(inputs["src"]), str(out), "--target", str(inputs["target"]), "--types", types, "--jobs", "1",
            *SMALL, *map(str, extra)]


@pytest.fixture(scope="module")
def finished(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from dflashkit.cli import release_command

    out = tmp_path_factory.mktemp("finished") / "release"
    res = CliRunner().invoke(release_command, release_args(inputs, out))
    assert res.exit_code == 0, res.output
    return out


def run_release(tmp_path: Path, args: list[str], inputs: list[Path], tmp_name: str = "tmp",
                **kw: object):  # type: ignore[no-untyped-def]
    return run_contained("release_command", args, inputs=inputs, tmp=tmp_path / tmp_name, **kw)  # type: ignore[arg-type]


def check(tmp_path: Path, out: Path, name: str = "tmp-check", outside: list[Path] = ()):  # type: ignore[no-untyped-def]
    return run_contained("release_command", ["--check", str(out)], inputs=[out, *outside], tmp=tmp_path / name)


def edit_record(out: Path, edit) -> None:  # type: ignore[no-untyped-def]
    record = json.loads((out / "release.json").read_text())
    edit(record)
    (out / "release.json").write_text(json.dumps(record, indent=2))


# --- 1. user data: OUTDIR is the release's alone -------------------------------------------------------------------


def test_a_folder_of_the_users_files_is_refused_untouched(tmp_path: Path, inputs: dict) -> None:
    out = tmp_path / "out"
    (out / ".dflash-release").mkdir(parents=True)
    (out / "README.md").write_text("my own notes\n")
    (out / "SHA256SUMS").write_text("my sums\n")
    (out / "drafter-Q8_0.gguf").write_bytes(b"my own GGUF")
    (out / ".dflash-release" / "keep.txt").write_text("mine\n")
    run = run_release(tmp_path, release_args(inputs, out), [out, *inputs.values()])
    check_contained(run, 2, f"{out / 'README.md'}: not a file of this release — dflash-release writes only into an "
                            "empty folder or a release of the same inputs")


def test_a_foreign_file_in_the_work_folder_is_named(tmp_path: Path, inputs: dict) -> None:
    out = tmp_path / "out"
    (out / ".dflash-release").mkdir(parents=True)
    (out / ".dflash-release" / "keep.txt").write_text("mine\n")
    run = run_release(tmp_path, release_args(inputs, out), [out, *inputs.values()])
    check_contained(run, 2, f"{out / '.dflash-release' / 'keep.txt'}: not a file of a release's work folder")


def test_a_release_of_other_inputs_is_not_overwritten(tmp_path: Path, inputs: dict, finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    run = run_release(tmp_path, release_args(inputs, out, "--seed", "7"), [out, *inputs.values()])
    check_contained(run, 2, f"{out}: holds a release of other inputs or settings (drafter, BF16, Q8_0)")


def test_a_work_folder_that_links_elsewhere_is_refused(tmp_path: Path, inputs: dict) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / ".dflash-release").symlink_to(elsewhere)
    run = run_release(tmp_path, release_args(inputs, out), [*inputs.values()])
    check_contained(run, 2, f"{out / '.dflash-release'}: is not a folder the release made (a symbolic link or a file)")
    assert list(elsewhere.iterdir()) == []


def test_a_work_folder_that_is_a_file_is_refused(tmp_path: Path, inputs: dict) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".dflash-release").write_text("not a folder\n")
    run = run_release(tmp_path, release_args(inputs, out), [out, *inputs.values()])
    check_contained(run, 2, f"{out / '.dflash-release'}: is not a folder the release made")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a bind mount")
def test_outdir_a_bind_mount_of_the_source_is_found_by_device_and_inode(tmp_path: Path, inputs: dict) -> None:
    out = tmp_path / "mounted"
    out.mkdir()
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here for a bind mount: {probe.stderr.decode()[:200]}")
    before = fingerprint(inputs.values())
    code = ("from dflashkit.cli import release_command\nimport sys\n"
            f"release_command({release_args(inputs, out)!r})")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           f'mount --bind "$1" "$2" && exec "$3" -c "$4"', "sh", str(inputs["src"]), str(out),
                           sys.executable, code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"error: {out}: is inside the input {inputs['src']} — write the release to another "
                                   "folder (inputs are never modified)")
    assert fingerprint(inputs.values()) == before and list(out.iterdir()) == []


def test_a_second_release_into_a_held_folder_names_the_holder(tmp_path: Path, inputs: dict) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    first = subprocess.Popen([*hostile.cli("release_command"), *release_args(inputs, out, types="bf16")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (out / ".dflash-release" / "owner.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    run = run_release(tmp_path, release_args(inputs, out, types="bf16"), [*inputs.values()])
    _, err = first.communicate(timeout=300)
    check_contained(run, 2, f"{out}: another dflash-release (PID {first.pid}) is writing this folder — wait for it to "
                            "end, or give another OUTDIR")
    assert first.returncode == 0, err
    done = check(tmp_path, out)
    check_contained(done, 0)


# --- 2. laundered figures: release.json is input, not truth ------------------------------------------------------


def test_an_edited_figure_fails_the_check_and_no_resume_keeps_it(tmp_path: Path, inputs: dict, finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    genuine = json.loads((out / "release.json").read_text())["jobs"]["Q8_0"]["tau"]
    edit_record(out, lambda r: r["jobs"]["Q8_0"]["tau"].update(mean=genuine["mean"] + 1.5))
    run = check(tmp_path, out)
    check_contained_lines(run, 1, f"error: {out / 'release.json'}: jobs.Q8_0.tau.mean is {genuine['mean'] + 1.5}, its "
                                  "per-prompt values give")
    # a consistent forgery of the record (mean and per-prompt values) — still not kept: the job's seal breaks
    edit_record(out, lambda r: r["jobs"]["Q8_0"]["tau"].update(
        mean=genuine["mean"] + 1.5, per_prompt=[x + 1.5 for x in genuine["per_prompt"]]))
    resumed = run_release(tmp_path, release_args(inputs, out)[:-1], [*inputs.values()], )
    check_contained(resumed, 0)
    said = resumed.stderr
    assert "BF16: kept" in said and "Q8_0: started" in said and "Q8_0: kept" not in said, said
    assert json.loads((out / "release.json").read_text())["jobs"]["Q8_0"]["tau"] == genuine
    check_contained(check(tmp_path, out, "tmp-check2"), 0)


def check_contained_lines(run, code: int, first: str) -> None:  # type: ignore[no-untyped-def]
    """``--check``: exit ``code``, every line an ``error:`` line, the first one ``first``, and contained."""
    lines = run.lines()
    assert run.returncode == code and lines and lines[0].startswith(first), run.stderr[-2000:]
    assert all(line.startswith("error: ") for line in lines) and len(lines) <= 20
    check_contained(run, code)


def test_sums_that_list_files_outside_the_release_fail_unread(tmp_path: Path, finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "rel" / "out"))
    fifo = tmp_path / "rel" / "fifo"
    os.mkfifo(fifo)  # read, it would block for ever
    with open(out / "SHA256SUMS", "a") as f:
        f.write(f"{'0' * 64}  ../fifo\n{'0' * 64}  /etc/shadow\n{'0' * 64}  ../../etc/passwd\n")
    run = check(tmp_path, out)
    assert run.elapsed_s < 60
    check_contained_lines(run, 1, f"error: {out / 'SHA256SUMS'}:5: lists '../fifo', not a file of this release (not "
                                  "read)")
    assert len(run.lines()) == 3


# --- 3. reads outside OUTDIR ---------------------------------------------------------------------------------------


def test_a_record_naming_a_file_outside_is_refused_without_reading_it(tmp_path: Path, inputs: dict,
                                                                        finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(1 << 40)  # 1 TB that reads as zeros for as long as one cares to hash it
    edit_record(out, lambda r: r["jobs"]["Q8_0"].update(file=str(sparse)))
    run = check(tmp_path, out)
    check_contained(run, 1, f"{out / 'release.json'}: jobs.Q8_0.file: '{str(sparse)[:50]}", bounded=True)
    assert "is not a name a release writes — the record was edited" in run.lines()[0]
    resumed = run_release(tmp_path, release_args(inputs, out), [*inputs.values()])
    check_contained(resumed, 2, f"{out / 'release.json'}: not a release record this version of dflashkit wrote",
                    bounded=True)


def test_a_card_that_links_outside_is_not_shown(tmp_path: Path, finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    secret = tmp_path / ".env"
    secret.write_text("HF_TOKEN=hf_the_secret_token\n")
    (out / "README.md").unlink()
    (out / "README.md").symlink_to(secret)
    run = check(tmp_path, out, outside=[secret])
    check_contained_lines(run, 1, f"error: {out / 'README.md'}: a symbolic link, not a file of the release")
    assert "hf_the_secret_token" not in run.stderr + run.stdout


# --- 4. unbounded input --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["README.md", "SHA256SUMS"])
def test_a_3_gb_card_or_sums_is_refused_at_its_size(tmp_path: Path, finished: Path, name: str) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    with open(out / name, "r+b") as f:
        f.truncate(3 << 30)
    run = check(tmp_path, out)
    assert run.elapsed_s < 60
    first = [line for line in run.lines() if f"{out / name}: " in line][0]
    assert f"{3 << 30} bytes, over the" in first
    check_contained(run, 1)


def test_fifteen_thousand_prompts_in_a_record_are_refused_under_the_cap(tmp_path: Path, finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    edit_record(out, lambda r: r["jobs"]["Q8_0"]["tau"].update(per_prompt=[2.0] * 15_000, prompts=15_000))
    run = check(tmp_path, out)
    check_contained(run, 1, "jobs.Q8_0.tau.per_prompt: list is not a list of 0 to 2 values", bounded=True)


# --- 5. internal errors: a tampered record is one line ------------------------------------------------------------


CHECK_EDITS = {
    "size 10^400": (lambda r: r["jobs"]["Q8_0"].update(size_bytes=10**400), "jobs.Q8_0.size_bytes: "),
    "seed Infinity": (lambda r: r["settings"].update(seed=float("inf")), "settings.seed: inf is not an integer"),
    "settings a list": (lambda r: r.update(settings=[1, 2]), "settings: list is not an object"),
    "types an int": (lambda r: r.update(types=3), "types: 3 is not a list"),
    "a job's file an int": (lambda r: r["jobs"]["BF16"].update(file=7), "jobs.BF16.file: 7 is not a string"),
    "jobs a list": (lambda r: r.update(jobs=[]), "jobs: list is not an object"),
    "a job a string": (lambda r: r["jobs"].update(BF16="done"), "jobs.BF16: 'done' is not an object"),
}


@pytest.mark.parametrize("case", list(CHECK_EDITS))
def test_a_tampered_record_is_one_line_in_check(tmp_path: Path, finished: Path, case: str) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    edit, message = CHECK_EDITS[case]
    edit_record(out, edit)
    check_contained(check(tmp_path, out), 1, message)


RESUME_EDITS = {
    "jobs a list": lambda r: r.update(jobs=[]),
    "gates_failed a string": lambda r: r["jobs"]["BF16"].update(gates_failed="none"),
    "tau null": lambda r: r["jobs"]["BF16"].update(tau=None),
    "a job without keys": lambda r: r["jobs"].update(BF16={}),
}


@pytest.mark.parametrize("case", list(RESUME_EDITS))
def test_a_tampered_record_is_one_line_in_a_resume(tmp_path: Path, inputs: dict, finished: Path, case: str) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    edit_record(out, RESUME_EDITS[case])
    run = run_release(tmp_path, release_args(inputs, out), [out, *inputs.values()])
    check_contained(run, 2, f"{out / 'release.json'}: not a release record this version of dflashkit wrote")


@pytest.mark.parametrize("front_matter, key", [("license:\n  name: mit\n", "general.license as object, not text"),
                                               ("tags: [1, {a: 2}]\n", "general.tags cannot be written to a GGUF")])
def test_a_source_card_gguf_cannot_hold_is_named(tmp_path: Path, inputs: dict, front_matter: str, key: str) -> None:
    src = Path(shutil.copytree(inputs["src"], tmp_path / "drafter"))
    (src / "README.md").write_text(f"---\n{front_matter}---\n# card\n")
    out = tmp_path / "out"
    run = run_release(tmp_path, [str(src), str(out), *release_args(inputs, out, types="bf16")[2:]], [src])
    check_contained(run, 1, f"{src / 'README.md'}: the model card")
    assert key in run.lines()[0] and not out.exists()


@pytest.mark.parametrize("extra, message", [
    (["--ray", "garbage"], "--ray garbage: Ray could not start or connect (ValueError: Invalid address format"),
    (["--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1: no Ray cluster answers there"),
    (["--ray", "--ray-gpus-per-job", "1"], "--ray-gpus-per-job 1: the Ray cluster has 0 GPU(s)"),
])
def test_rays_own_errors_are_one_line_before_any_work(tmp_path: Path, inputs: dict, extra: list[str],
                                                      message: str) -> None:
    out = tmp_path / "out"
    run = run_release(tmp_path, release_args(inputs, out, "--ray-timeout", "20", *extra, types="bf16"),
                      [*inputs.values()], env={"RAY_ADDRESS": ""})
    check_contained(run, 1, message, bounded=True)
    assert not out.exists()  # said before the conversion: nothing of the run is left


def _ray_folders() -> set[str]:
    return {p.name for p in Path("/tmp").glob("dflashkit-ray-*")}


@pytest.mark.parametrize("tmpdir", ["short", "too long for Ray's sockets"])
def test_a_local_ray_cluster_leaves_no_session_folder_or_process(tmp_path: Path, inputs: dict, tmpdir: str) -> None:
    out = tmp_path / "out"
    env = {}
    if tmpdir != "short":  # Ray's socket paths would pass 107 bytes there: the cluster runs under /tmp instead
        deep = tmp_path / ("t" * 100)
        deep.mkdir()
        env = {"TMPDIR": str(deep)}
    run = run_release(tmp_path, release_args(inputs, out, "--ray", types="bf16"), [*inputs.values()], env=env)
    check_contained(run, 0)  # nothing in its temp folder (no ray/session_*), no Ray process left in its session
    assert [f for f in _ray_folders() if f.startswith(f"dflashkit-ray-{run.extra['pid']}-")] == []
    if env:
        assert list(Path(env["TMPDIR"]).iterdir()) == []


@pytest.mark.parametrize("extra, message", [
    (["--seed", "18446744073709551616"], "Error: Invalid value for '--seed': 18446744073709551616 is not in the range"),
    (["--ray-gpus-per-job", "nan"], "Error: Invalid value for '--ray-gpus-per-job': 'nan' is not a finite number."),
])
def test_an_out_of_range_argument_is_a_usage_error_at_once(tmp_path: Path, inputs: dict, extra: list[str],
                                                           message: str) -> None:
    out = tmp_path / "out"
    run = run_release(tmp_path, release_args(inputs, out, *extra), [*inputs.values()])
    check_contained(run, 2, None, bounded=True)
    assert message in run.stderr and not out.exists()


# --- 6. signals and leftovers ---------------------------------------------------------------------------------------


def _recorded_files(out: Path) -> set[str]:
    try:
        return {j["file"] for j in json.loads((out / "release.json").read_text())["jobs"].values()}
    except (OSError, ValueError, KeyError):
        return set()


def _one_job_recorded(out: Path):  # type: ignore[no-untyped-def]
    return lambda: len(_recorded_files(out)) >= 1


@pytest.mark.parametrize("how", ["Ctrl-C to the group", "INT to the main process", "TERM", "HUP"])
def test_a_signal_ends_every_worker_and_leaves_only_recorded_files(tmp_path: Path, inputs: dict, how: str) -> None:
    out = tmp_path / "out"
    signum = {"TERM": signal.SIGTERM, "HUP": signal.SIGHUP}.get(how, signal.SIGINT)
    args = release_args(inputs, out, types="bf16,q8_0,q6_k,q5_k_m")
    args[args.index("--jobs") + 1] = "2"
    run = run_release(tmp_path, args, [*inputs.values()], signal_when=(_one_job_recorded(out), signum),
                      group=how == "Ctrl-C to the group")
    expected = 130 if signum == signal.SIGINT else -signum
    check_contained(run, expected)  # no worker left (by session and PID), nothing in the temp folder
    if signum == signal.SIGINT:
        assert len(run.lines()) == 1, run.stderr[-3000:]
        (line,) = run.lines()  # quietly: one line, no worker's traceback
        assert line.startswith("interrupted: ") and "finished and recorded in" in line, line
    assert run.elapsed_s - run.extra["signalled_at"] < 10, "stopped long after the signal"
    ggufs = {p.name for p in out.glob("*.gguf")}
    assert ggufs and ggufs <= _recorded_files(out), (ggufs, _recorded_files(out))


def test_a_killed_release_leaves_no_worker_and_the_next_run_finishes(tmp_path: Path, inputs: dict) -> None:
    out = tmp_path / "out"
    args = release_args(inputs, out, types="bf16,q8_0,q6_k")
    args[args.index("--jobs") + 1] = "2"
    run = run_release(tmp_path, args, [*inputs.values()], signal_when=(_one_job_recorded(out), signal.SIGKILL))
    assert run.returncode == -signal.SIGKILL and run.left_running == []  # the workers died with it (PDEATHSIG)
    again = run_release(tmp_path, args, [*inputs.values()], tmp_name="tmp2")
    check_contained(again, 0)
    check_contained(check(tmp_path, out), 0)


def test_a_killed_accept_leaves_a_temp_folder_the_next_command_removes(tmp_path: Path, pair: dict) -> None:
    from test_hostile_round3 import accept_args, stand_in

    bin_dir = stand_in(tmp_path / "bin", f"Path({str(tmp_path / 'busy')!r}).touch()\ntime.sleep(3600)")
    tmp = tmp_path / "tmp"
    run = run_contained("accept_command", accept_args(pair, "--llama-cpp", bin_dir, "--target-gguf",
                                                      pair["target_gguf"], "--max-prompts", "1"),
                        inputs=[pair["target"], pair["prompts"]], tmp=tmp, pid_folder=bin_dir,
                        signal_when=(tmp_path / "busy", signal.SIGKILL))
    assert run.returncode == -signal.SIGKILL and run.left_running == []
    left = [p.name for p in tmp.iterdir() if p.name.startswith("dflashkit-")]
    assert len(left) == 1 and left[0].startswith("dflashkit-llama-"), left  # the converted drafter's folder
    env = {**os.environ, "TMPDIR": str(tmp)}
    done = subprocess.run([*hostile.cli("release_command"), "--check", str(tmp_path / "nothing")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and not (tmp / left[0]).exists(), done.stderr


# --- 7. the card is text --------------------------------------------------------------------------------------------


HOSTILE = "x`\n```\n<img src=x onerror=alert(1)>\n# Injected\n<iframe src=evil>"  # no "/": a file name


def test_names_from_input_cannot_inject_markup_into_the_card(tmp_path: Path, inputs: dict) -> None:
    from huggingface_hub import ModelCard
    from markdown_it import MarkdownIt

    src = Path(shutil.copytree(inputs["src"], tmp_path / f"src{HOSTILE}"))
    target = Path(shutil.copytree(inputs["target"], tmp_path / f"tgt{HOSTILE}"))
    prompts = tmp_path / f"p{HOSTILE}.jsonl"
    shutil.copyfile(TRAINED / "prompts.jsonl", prompts)
    out = tmp_path / "out"
    run = run_release(tmp_path, [str(src), str(out), "--target", str(target), "--types", "bf16", "--jobs", "1",
                                 "--prompts", str(prompts), *SMALL], [src, target, prompts])
    check_contained(run, 0)
    text = (out / "README.md").read_text()
    card = ModelCard(text)
    assert card.data.base_model == f"src{HOSTILE}" and card.data.base_model_relation == "quantized"
    tokens = MarkdownIt("commonmark").parse(card.text)
    assert [t.type for t in tokens if t.type in ("html_block", "html_inline")] == []
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    name = json.loads((out / "release.json").read_text())["name"]
    assert name == "srcx-------img-src-x-onerror-alert-1-----Injected--iframe-src-evil-"
    assert headings == [f"{name} — GGUF", "Files", "Recommended", "Run it beside its target",
                        "How the figures were measured", "Provenance"], headings
    fences = [t for t in tokens if t.type == "fence"]
    assert len(fences) == 1 and fences[0].content.startswith("llama-server -m ") and \
        fences[0].content.count("\n") == 1
    assert str(tmp_path) not in text  # nothing private: no path of this machine


# --- 8. the second attacker's pass (issue 39): each finding planted again ---------------------------------------


@pytest.mark.parametrize("how", ["a link and ..", "a link to a sub-folder"])
def test_outdir_reached_through_a_link_into_an_input_is_refused(tmp_path: Path, inputs: dict, how: str) -> None:
    target = Path(shutil.copytree(inputs["target"], tmp_path / "tgt"))
    (target / "sub").mkdir()
    link = tmp_path / "L"
    link.symlink_to(target / "sub")
    out = Path(f"{link}/../out") if how == "a link and .." else link
    args = release_args({**inputs, "target": target}, out, types="bf16")
    run = run_release(tmp_path, args, [target, *inputs.values()])
    check_contained(run, 2, "is inside the input")
    assert sorted(p.name for p in target.iterdir()) == sorted([*(p.name for p in inputs["target"].iterdir()), "sub"])


def test_replaced_weights_are_measured_again_not_kept(tmp_path: Path, inputs: dict) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    src = Path(shutil.copytree(inputs["src"], tmp_path / "drafter"))
    out = tmp_path / "out"
    args = [str(src), str(out), *release_args(inputs, out, types="bf16")[2:]]
    check_contained(run_release(tmp_path, args, [inputs["target"]]), 0)
    first = json.loads((out / "release.json").read_text())["jobs"]["BF16"]
    weights = load_file(src / "model.safetensors")
    torch.manual_seed(0)
    save_file({k: torch.randn(v.shape).to(v.dtype) for k, v in weights.items()}, src / "model.safetensors")
    again = run_release(tmp_path, args, [inputs["target"]], tmp_name="tmp2")
    check_contained(again, 0)  # the same release (same paths, same settings): measured again, not kept
    assert json.loads((out / "release.json").read_text())["jobs"]["BF16"]["sha256"] != first["sha256"]
    check_contained(check(tmp_path, out), 0)


def test_a_users_gguf_under_a_type_files_name_is_refused_and_kept(tmp_path: Path, inputs: dict,
                                                                  finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    (out / "drafter-Q4_K_M.gguf").write_bytes(b"MINE")
    run = run_release(tmp_path, release_args(inputs, out, types="bf16,q8_0,q4_k_m"), [out, *inputs.values()])
    check_contained(run, 2, f"{out / 'drafter-Q4_K_M.gguf'}: not a file of this release")


def test_check_finds_an_extra_file_and_a_resume_with_fewer_types_drops_its_own(tmp_path: Path, inputs: dict,
                                                                                 finished: Path) -> None:
    extra = Path(shutil.copytree(finished, tmp_path / "extra"))
    (extra / "drafter-Q4_K_M.gguf").write_bytes(b"evil")
    check_contained_lines(check(tmp_path, extra), 1, f"error: {extra / 'drafter-Q4_K_M.gguf'}: not a file of this "
                                                     "release")
    fewer = Path(shutil.copytree(finished, tmp_path / "fewer"))
    run = run_release(tmp_path, release_args(inputs, fewer, types="bf16"), [*inputs.values()], tmp_name="tmp2")
    check_contained(run, 0)
    assert not (fewer / "drafter-Q8_0.gguf").exists()
    check_contained(check(tmp_path, fewer, "tmp-check2"), 0)


def test_a_1_tb_card_is_not_hashed(tmp_path: Path, finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    with open(out / "README.md", "r+b") as f:
        f.truncate(1 << 40)
    # the folder's other files are the inputs watched (fingerprinting the sparse card would read 1 TB itself)
    run = run_contained("release_command", ["--check", str(out)], inputs=[p for p in out.iterdir() if
                                                                             p.name != "README.md"], tmp=tmp_path / "t")
    assert run.elapsed_s < 60 and run.returncode == 1
    assert not any("does not match its line" in line for line in run.lines()), run.stderr


@pytest.mark.parametrize("separator", ["\r", "\v", "\u2028"])
def test_sums_split_where_sha256sum_does_not_split_fail(tmp_path: Path, finished: Path, separator: str) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    lines = (out / "SHA256SUMS").read_text().splitlines()
    (out / "SHA256SUMS").write_text(separator.join(lines) + "\n")
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True).returncode != 0
    run = check(tmp_path, out)  # one line to sha256sum -c: what it lists is no file of the release, and none is listed
    assert run.returncode == 1 and run.lines()[0].startswith(f"error: {out / 'SHA256SUMS'}:1: "), run.stderr
    assert f"error: {out / 'SHA256SUMS'}: does not list README.md" in run.lines(), run.stderr


def test_a_lone_surrogate_in_the_record_is_one_line(tmp_path: Path, finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "out"))
    text = (out / "release.json").read_text().replace('"target_gguf_name": "target.gguf"',
                                                      '"target_gguf_name": "\\ud800.gguf"')
    (out / "release.json").write_text(text)
    check_contained(check(tmp_path, out), 1, "target_gguf_name: '\\\\ud800.gguf' is not valid UTF-8 text")


@pytest.mark.parametrize("case, message", [
    ("a target GGUF whose name is not UTF-8", "--target-gguf: the name"),
    ("a source repo id of 304 characters", "SRC: a name of 304 characters"),
    ("--target-gguf without a llama.cpp build", "--target-gguf only matters with --llama-cpp or --llama-server"),
])
def test_names_the_record_cannot_hold_are_refused_before_any_work(tmp_path: Path, inputs: dict, case: str,
                                                                    message: str) -> None:
    out = tmp_path / "out"
    extra: list[str] = []
    if case.startswith("a target GGUF"):
        bad = Path(os.fsdecode(bytes(tmp_path) + b"/t\xfd.gguf"))
        bad.write_bytes(b"GGUF")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "llama-server").write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / "llama-server").chmod(0o755)
        extra = ["--llama-server", str(bin_dir), "--target-gguf", str(bad)]
    elif case.startswith("a source repo"):
        extra = ["--source-repo", "org/" + "r" * 300]
    else:
        target_gguf = tmp_path / "target.gguf"
        target_gguf.write_bytes(b"GGUF")
        extra = ["--target-gguf", str(target_gguf)]
    run = run_release(tmp_path, release_args(inputs, out, *extra, types="bf16"), [*inputs.values()])
    check_contained(run, 2, message, bounded=True)
    assert not out.exists()


def test_a_folder_near_path_max_is_one_line(tmp_path: Path, inputs: dict) -> None:
    out = tmp_path / "/".join(["d" * 250] * 17)
    run = run_release(tmp_path, release_args(inputs, out, types="bf16"), [*inputs.values()])
    assert run.returncode in (1, 2) and len(run.lines()) == 1 and "internal error" not in run.stderr, run.stderr


def test_a_users_folder_that_looks_like_a_temp_folder_is_kept(tmp_path: Path, finished: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    mine = tmp / "dflashkit-release-2025-v2"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    done = subprocess.run([*hostile.cli("release_command"), "--check", str(finished)], capture_output=True,
                          env={**os.environ, "TMPDIR": str(tmp)}, timeout=120)
    assert done.returncode == 0 and (mine / "notes.txt").read_text() == "mine\n"
