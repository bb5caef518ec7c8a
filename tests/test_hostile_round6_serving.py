"""Issue 56, hostile round 6 of serving: a crash is a crash, and only possible figures.

A ``--parallel`` level whose llama-server dies (killed while generating, or aborting by itself at start as 0.3.36
does at ``--parallel 64``) reads *crashed* with its signal and last lines in the report, its JSON (null figures,
never "nan"), the release record and the card, and fails ``--min-speedup``. A reply whose ``id_slot`` is no slot of
the server's ``-np`` is refused, named; a slot that never replied is named, never "drafts like slot 0". A record
forged consistently (its card and SHA256SUMS rewritten to match) with a τ past the drafter's block, a per-slot τ
of 0.5 or 4000, an underived ``server_tau``, a NaN, or a figure beside a level that refused or crashed fails
``--check`` with one ``error:`` line, the folder left byte for byte as it was. Each case plants its own stand-in
(`standin_server`'s script with one hook added)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner

import standin_server
from dflashkit.accept.options import ContextOptions, LlamaCppOptions, PromptOptions
from dflashkit.cli import accept_command, convert_command, release_command
from dflashkit.release import check_release, release
from dflashkit.release.card import render_card
from dflashkit.reporting.markdown import markdown_text

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]  # accept and a release, stand-ins

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"

#: hooks added to the stand-in: ``die`` ("NP SIGNAL load|generate": the drafter's server at -np NP dies so),
#: ``die_nth`` ("K SIGNAL": the K-th server started with a drafter dies generating) and ``id_slot`` (the slot every
#: reply of a server with -np > 1 names)
HOOKS = [
    ('n_slots = int(argv[argv.index("-np") + 1]) if "-np" in argv else 1\n',
     'die = (here / "die").read_text().split() if (here / "die").exists() else None\n'
     'forged_slot = (here / "id_slot").read_text() if (here / "id_slot").exists() else None\n'
     'if draft and (here / "die_nth").exists():  # "K SIGNAL": the K-th server started with -md dies generating\n'
     '    with open(here / "md-starts", "a") as f:\n'
     '        f.write("x")\n'
     '    nth = (here / "die_nth").read_text().split()\n'
     '    if (here / "md-starts").stat().st_size == int(nth[0]):\n'
     '        die = [str(n_slots), nth[1], "generate"]\n'
     'if die and draft and n_slots == int(die[0]) and die[2] == "load":\n'
     '    sys.stderr.write("GGML_ASSERT(n_slots <= 32) failed\\n")\n'
     '    sys.stderr.flush()\n'
     '    os.kill(os.getpid(), getattr(signal, die[1]))\n'),
    ('        n = request["n_predict"]\n',
     '        if die and draft and n_slots == int(die[0]) and die[2] == "generate":\n'
     '            sys.stderr.write("srv  update_slots: decoding the batch\\n")\n'
     '            sys.stderr.flush()\n'
     '            os._exit(int(die[1][4:])) if die[1].startswith("EXIT") else os.kill(os.getpid(), getattr(signal, die[1]))\n'
     '        if not draft and (here / "base_dies_past").exists() \\\n'
     '                and len(request["prompt"]) > int((here / "base_dies_past").read_text()):\n'
     '            sys.stderr.write("srv  update_slots: the target alone aborts\\n")\n'
     '            sys.stderr.flush()\n'
     '            os.kill(os.getpid(), signal.SIGABRT)\n'),
    ('"id_slot": slot})', '"id_slot": slot if forged_slot is None or n_slots == 1 else json.loads(forged_slot)})'),
]


def _standin(folder: Path, **hooks: str) -> Path:
    """The stand-in llama-server with `HOOKS` (each hook's file written from ``hooks``)."""
    script = standin_server.SCRIPT
    for old, new in HOOKS:
        assert script.count(old) == 1, old  # the stand-in changed: the hook would not be where it must be
        script = script.replace(old, old + new if old.endswith("\n") else new)
    standin_server.make(folder, ms_per_token=1.0)
    (folder / "llama-server").write_text(f"#!{sys.executable}\n{script}")
    (folder / "llama-server").chmod((folder / "llama-server").stat().st_mode | stat.S_IXUSR)
    for name, value in hooks.items():
        (folder / name).write_text(value)
    return folder


@pytest.fixture(scope="module")
def drafter_gguf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("r6")
    gguf = tmp / "drafter-bf16.gguf"
    res = CliRunner().invoke(convert_command, [str(TRAINED / "drafter"), str(gguf), "--outtype", "bf16", "--target",
                                               str(TRAINED / "target"), "-q"])
    assert res.exit_code == 0, res.output
    target = tmp / "target.gguf"
    target.write_bytes(b"GGUF")
    return {"drafter": gguf, "target": target}


def _accept(files: dict[str, Path], build: Path, *extra: str) -> Any:
    return CliRunner().invoke(accept_command, [
        str(files["drafter"]), "--target", str(TRAINED / "target"), "--prompts", str(TRAINED / "prompts.jsonl"),
        "--max-prompts", "4", "--max-new-tokens", "16", "--llama-server", str(build), "--target-gguf",
        str(files["target"]), "--parallel", "1,2", "--format", "json", "-q", *extra])


def _section(report: dict[str, Any], sid: str) -> dict[str, Any]:
    return next(s for s in report["sections"] if s.get("id") == sid)


@pytest.mark.parametrize("die, signal, phase", [("2 SIGKILL generate", "SIGKILL", "generating"),
                                                ("2 SIGABRT load", "SIGABRT", "loading"),
                                                # an exit once it served is a crash too, not a refusal of the files
                                                ("2 EXIT3 generate", "exit 3", "generating"),
                                                ("2 EXIT139 generate", "exit 139: SIGSEGV in a child", "generating")])
def test_a_parallel_level_whose_server_dies_reads_crashed_and_fails_min_speedup(
        drafter_gguf: dict[str, Path], tmp_path: Path, die: str, signal: str, phase: str) -> None:
    build = _standin(tmp_path / "bin", die=die)
    res = _accept(drafter_gguf, build, "--min-speedup", "0.5")
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and "internal error" not in res.output
    report = json.loads(res.stdout)
    np1, np2 = _section(report, "by_parallel")["rows"]
    # (-np 1 measured: its verdict is the stand-in's timing on a busy machine, not asserted)
    assert (np1["crashed"], np1["refused"]) == (False, None) and math.isfinite(np1["speedup"])
    assert np1["verdict"] in ("net gain", "no gain", "net loss")
    assert np2["verdict"] == "crashed" and np2["crashed"] is True
    # no figure, never "nan": null beside the reason
    assert (np2["speedup"], np2["speedup_ci"], np2["tok_s_on"], np2["tok_s_off"], np2["slot_tau"], np2["batches"]) == (
        None, None, None, None, {}, 0)
    assert f"llama-server crashed ({signal}) while {phase}: " in np2["refused"]
    last_line = "GGML_ASSERT(n_slots <= 32) failed" if phase == "loading" else "srv  update_slots: decoding the batch"
    assert np2["refused"].endswith(last_line)
    assert "nan" not in json.dumps(_section(report, "by_parallel")).lower()
    findings = _section(report, "parallel_findings")["items"]
    assert findings == [f"drafter-bf16.gguf at -np 2: {np2['refused']}"]
    assert report["status"] == f"drafter-bf16.gguf at -np 2: no speed-up measured (crashed): {np2['refused']}"
    assert res.stderr.splitlines() == [f"dflash-accept: {report['status']}"]  # the reason for exit 1, one line
    # the same run without the gate: the crash is reported, and the level is no gain, no loss, no figure
    assert _accept(drafter_gguf, build).exit_code == 0


@pytest.mark.parametrize("slot", ["7", "-1", "\"0\"", "null"])
def test_a_reply_naming_no_slot_of_the_servers_np_is_refused(drafter_gguf: dict[str, Path], tmp_path: Path,
                                                             slot: str) -> None:
    build = _standin(tmp_path / "bin", id_slot=slot)
    res = _accept(drafter_gguf, build, "--min-speedup", "0.5")
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    np1, np2 = _section(report, "by_parallel")["rows"]
    assert np1["refused"] is None and np2["verdict"] == "refused" and np2["crashed"] is False
    assert np2["refused"] == (f"llama-server (drafter-bf16.gguf): llama-server reported impossible figures (id_slot "
                              f"{json.loads(slot)!r} from a server of 2 slot(s) (-np 2): its slots are 0 to 1) — "
                              "refused, not reported")
    assert np2["slot_tau"] == {} and np2["speedup"] is None
    items = _section(report, "parallel_findings")["items"]
    assert items == [f"drafter-bf16.gguf at -np 2: {np2['refused']}"]
    assert all("τ per slot 7" not in line for line in res.stdout.splitlines())


def test_every_slot_drafts_like_slot_0_only_when_every_slot_replied(drafter_gguf: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    build = _standin(tmp_path / "bin", id_slot="1")  # a slot of -np 2, but every reply names it: slot 0 never
    res = _accept(drafter_gguf, build)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    np2 = _section(report, "by_parallel")["rows"][1]
    assert np2["refused"] is None and list(np2["slot_tau"]) == ["1"]
    section = _section(report, "parallel_findings")
    assert section["items"] == ["drafter-bf16.gguf at -np 2: slot(s) 0 of -np 2 answered no request with a τ (slots "
                                "that did: 1): whether every slot drafts like slot 0 is not known"]
    assert "every slot drafts like slot 0" not in res.stdout.replace("whether every slot drafts like slot 0", "")


def _accept_by_context(files: dict[str, Path], build: Path) -> dict[str, Any]:
    """``--context 0,64`` through the stand-in ``build`` with ``--min-speedup 0.5``: its JSON report (exit 1)."""
    res = CliRunner().invoke(accept_command, [
        str(files["drafter"]), "--target", str(TRAINED / "target"), "--prompts", str(TRAINED / "prompts.jsonl"),
        "--max-prompts", "4", "--max-new-tokens", "16", "--llama-server", str(build), "--target-gguf",
        str(files["target"]), "--context", "0,64", "--format", "json", "-q", "--min-speedup", "0.5"])
    assert res.exit_code == 1, res.output
    return json.loads(res.stdout)


def test_a_context_level_whose_server_dies_has_no_figure_and_fails_min_speedup(drafter_gguf: dict[str, Path],
                                                                                tmp_path: Path) -> None:
    build = _standin(tmp_path / "bin", die_nth="2 SIGSEGV")  # --context 0,64: the second level's server dies
    report = _accept_by_context(drafter_gguf, build)
    short, long = _section(report, "by_context")["rows"]
    assert short["server_refused"] is None and short["speedup"] > 0 and short["tau_server"] > 1  # (timing: any)
    assert (long["tau_server"], long["speedup"], long["speedup_ci"]) == (None, None, None)
    assert "llama-server crashed (SIGSEGV) while generating: " in long["server_refused"]
    assert "nan" not in json.dumps(_section(report, "by_context")).lower()
    assert _section(report, "context_server")["items"] == [f"drafter-bf16.gguf at --context 64: {long['server_refused']}"]
    assert report["status"] == (f"at --context 64: drafter-bf16.gguf on target.gguf (draft cache default, n-max 15): "
                                f"llama-server crashed: {long['server_refused']}")


def test_a_context_level_whose_target_alone_dies_keeps_the_run(drafter_gguf: dict[str, Path], tmp_path: Path) -> None:
    """The target alone (no drafter's fault) dies past the first level: that level has no figure, for that reason;
    the report — the first level's figures, the reference's τ at every level — is kept (it was lost whole)."""
    build = _standin(tmp_path / "bin", base_dies_past="300")  # a prompt after 64 tokens of context is longer
    report = _accept_by_context(drafter_gguf, build)
    short, long = _section(report, "by_context")["rows"]
    assert short["server_refused"] is None and short["speedup"] > 0 and long["tau"] >= 1
    assert (long["tau_server"], long["speedup"]) == (None, None)
    assert long["server_refused"] == (f"the target alone (llama-server (target alone)) failed: {drafter_gguf['target']}: "
                                      "llama-server crashed (SIGABRT) while generating: main: loading model | srv  "
                                      "update_slots: the target "
                                      "alone aborts")
    assert report["status"].startswith("at --context 64: drafter-bf16.gguf on target.gguf (draft cache default, n-max "
                                       "15): llama-server crashed: the target alone")


# ---- the release: its record, card and --check ------------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release whose -np 2 server dies while generating (and with by-context figures through llama-server)."""
    tmp = tmp_path_factory.mktemp("crashed")
    build = _standin(tmp / "llama-build-a" / "bin", die="2 SIGKILL generate")
    target_gguf = tmp / "Qwen3-tiny-BF16.gguf"
    target_gguf.write_bytes(b"GGUF")
    out = tmp / "release"
    release(TRAINED / "drafter", out, target=TRAINED / "target", types="bf16", workers=1,
            prompt_options=PromptOptions(TRAINED / "prompts.jsonl", max_prompts=4, max_new_tokens=16),
            llama=LlamaCppOptions(llama_servers=(str(build),), target_ggufs=(str(target_gguf),), parallel=(1, 2)),
            context=ContextOptions((0, 64)), parity_rounds=1)
    return out


def test_a_release_whose_parallel_server_dies_records_and_shows_crashed(crashed_release: Path) -> None:
    record = json.loads((crashed_release / "release.json").read_text())
    np1, np2 = record["by_parallel"]["rows"]["BF16"]
    assert np1["refused"] is None and np1["crashed"] is False and len(np1["on"]) == 4
    assert np2["crashed"] is True and (np2["on"], np2["off"], np2["slot_tau"], np2["findings"]) == ([], [], {}, [])
    assert "llama-server crashed (SIGKILL) while generating: " in np2["refused"]
    assert np2["refused"].endswith("srv  update_slots: decoding the batch")
    assert str(crashed_release.parent) not in np2["refused"]  # scrubbed: nothing of the machine
    card = (crashed_release / "README.md").read_text()
    row = [line for line in card.splitlines() if line.startswith("| BF16 | 2 |")]
    assert row == ["| BF16 | 2 | — | — | — | — | — | crashed |"]
    assert f"- BF16 at -np 2: {markdown_text(np2['refused'])}" in card
    # every by-context row measured through llama-server keeps its per-prompt τ there, and --check derives it
    for r in record["by_context"]["rows"]["BF16"]:
        assert len(r["server_tau_per_prompt"]) == 4 and r["server_refused"] is None
    assert check_release(crashed_release) == []


def _tree(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _forge(crashed_release: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy whose record ``edit`` changed, its card rendered again and SHA256SUMS rewritten to match: a forgery
    consistent across the folder."""
    out = Path(shutil.copytree(crashed_release, tmp_path / "forged"))
    record = json.loads((out / "release.json").read_text())
    edit(record)
    (out / "release.json").write_text(json.dumps(record, indent=2))  # NaN stays NaN (json.dumps allows it)
    try:
        (out / "README.md").write_text(render_card(record))
    except (ValueError, TypeError, KeyError, ZeroDivisionError):
        pass  # a record no card renders: the schema names it before the card is read
    lines = [f"{hashlib.sha256((out / name).read_bytes()).hexdigest()}  {name}"
             for name in sorted(p.name for p in out.iterdir() if p.name not in ("SHA256SUMS", "timings.json"))]
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return out


def _ctx(record: dict[str, Any], k: int = 1) -> dict[str, Any]:
    return record["by_context"]["rows"]["BF16"][k]


def _par(record: dict[str, Any], k: int) -> dict[str, Any]:
    return record["by_parallel"]["rows"]["BF16"][k]


FORGERIES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("by-context τ 17 for block 16", lambda r: _ctx(r)["tau_per_prompt"].__setitem__(0, 17.0),
     "by_context.rows.BF16[1].tau_per_prompt[0]: 17.0 is not a τ of a block-16 drafter (1 to 16: a round commits at "
     "most its 15 draft tokens and the bonus)"),
    ("by-context τ 0", lambda r: _ctx(r)["tau_per_prompt"].__setitem__(0, 0.0),
     "by_context.rows.BF16[1].tau_per_prompt[0]: 0.0 is not a τ of a block-16 drafter"),
    ("per-slot τ 0.5", lambda r: _par(r, 0)["slot_tau"].__setitem__("0", 0.5),
     "by_parallel.rows.BF16[0].slot_tau.0: 0.5 is not a τ of a block-16 drafter"),
    ("per-slot τ 4000", lambda r: _par(r, 0)["slot_tau"].__setitem__("0", 4000.0),
     "by_parallel.rows.BF16[0].slot_tau.0: 4000.0 is not a τ of a block-16 drafter"),
    ("a slot past -np", lambda r: _par(r, 0)["slot_tau"].__setitem__("7", 15.0),
     "by_parallel.rows.BF16[0].slot_tau: '7' is not a slot of -np 1 (0 to 0)"),
    ("server_tau 99", lambda r: _ctx(r).__setitem__("server_tau", 99.0),
     "by_context.rows.BF16[1].server_tau: 99.0 is not a τ of a block-16 drafter"),
    ("a job's τ past the block", lambda r: r["jobs"]["BF16"]["tau"].__setitem__("mean", 16.5),
     "jobs.BF16.tau.mean: 16.5 is not a τ of a block-16 drafter"),
    ("a NaN speed", lambda r: _par(r, 0)["on"].__setitem__(0, math.nan),
     "by_parallel.rows.BF16[0].on[0]: nan is not a finite number"),
    ("a NaN server τ", lambda r: _ctx(r).__setitem__("server_tau", math.nan),
     "by_context.rows.BF16[1].server_tau: nan is not a finite number"),
    ("speeds beside a crash", lambda r: _par(r, 1).update(on=[10.0], off=[5.0]),
     "by_parallel.rows.BF16[1].on: list beside crashed — a server that refused or crashed measured nothing"),
    ("a finding beside a refusal", lambda r: _par(r, 1).update(crashed=False, findings=["slot 1 drafts nothing"]),
     "by_parallel.rows.BF16[1].findings: list beside refused — a server that refused or crashed measured nothing"),
    ("crashed without its message", lambda r: _par(r, 1).update(refused=None),
     "by_parallel.rows.BF16[1].crashed: true without the crash's message in refused"),
    ("a level of no batch and no reason", lambda r: _par(r, 1).update(crashed=False, refused=None),
     "by_parallel.rows.BF16[1]: no batch measured and no reason in refused"),
    ("server figures beside a context refusal", lambda r: _ctx(r).__setitem__("server_refused", "crashed (SIGSEGV)"),
     "by_context.rows.BF16[1].server_tau: "),
    ("a speed-up beside a crashed combination",
     lambda r: r["jobs"]["BF16"]["serving"][0].update(verdict="crashed", refused="llama-server crashed (SIGSEGV)"),
     "jobs.BF16.serving[0].tau: "),
    ("a crash message beside a measured verdict",
     lambda r: r["jobs"]["BF16"]["serving"][0].update(refused="llama-server crashed (SIGSEGV)"),
     "jobs.BF16.serving[0].verdict: 'net gain' with refused 'llama-server crashed (SIGSEGV)' — the server's message "
     "goes with refused to load or crashed, and only with them"),
    # (a second attacker's pass)
    ("a speed-up of 5e21", lambda r: _ctx(r, 0).__setitem__("log_speedups", [50.0] * len(_ctx(r, 0)["log_speedups"])),
     "by_context.rows.BF16[0].log_speedups[0]: 50.0 is "),
    ("a billion tokens a second", lambda r: _par(r, 0)["on"].__setitem__(0, 1e9),
     "by_parallel.rows.BF16[0].on[0]: 1000000000.0 is "),
    ("no time alone", lambda r: _par(r, 0)["off"].__setitem__(0, 0.0),
     "by_parallel.rows.BF16[0].off[0]: 0.0 is "),
    ("a context level of 2^62", lambda r: (r["by_context"]["levels"].__setitem__(1, 2**62),
                                           _ctx(r).__setitem__("context", 2**62)),
     "by_context.levels[1]: 4611686018427387904 is "),
    ("an -np level twice", lambda r: r["by_parallel"]["rows"]["BF16"].__setitem__(1, dict(_par(r, 0))),
     "by_parallel.rows.BF16: its levels [1, 1] are not ascending and distinct"),
]


@pytest.mark.parametrize("name, edit, message", FORGERIES, ids=[f[0] for f in FORGERIES])
def test_check_refuses_a_consistently_forged_impossible_figure(crashed_release: Path, tmp_path: Path, name: str,
                                                               edit: Callable[[dict[str, Any]], None],
                                                               message: str) -> None:
    forged = _forge(crashed_release, tmp_path, edit)
    before = _tree(forged)
    res = CliRunner().invoke(release_command, ["--check", str(forged)])
    assert res.exit_code == 1, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {forged / 'release.json'}: {message}"), lines
    assert lines[0].endswith(" — the record was edited or is not a release's")
    assert "Traceback" not in res.output and "internal error" not in res.output
    assert _tree(forged) == before  # --check reads, never writes


def test_check_derives_server_tau_from_its_per_prompt_values(crashed_release: Path, tmp_path: Path) -> None:
    def edit(record: dict[str, Any]) -> None:
        _ctx(record)["server_tau"] = 5.0  # within the block, but not what the per-prompt values give

    forged = _forge(crashed_release, tmp_path, edit)
    derived = json.loads((crashed_release / "release.json").read_text())["by_context"]["rows"]["BF16"][1]["server_tau"]
    res = CliRunner().invoke(release_command, ["--check", str(forged)])
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [f"error: {forged / 'release.json'}: by_context.rows.BF16[1].server_tau is 5.0, "
                                       f"its per-prompt values give {derived:.6g}"]

    def unsourced(record: dict[str, Any]) -> None:
        del _ctx(record)["server_tau_per_prompt"]

    forged2 = _forge(crashed_release, tmp_path / "2", unsourced)
    res = CliRunner().invoke(release_command, ["--check", str(forged2)])
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [f"error: {forged2 / 'release.json'}: by_context.rows.BF16[1].server_tau is "
                                       f"{derived}, and no server_tau_per_prompt derives it"]


def test_a_reply_without_id_slot_is_refused_where_the_slots_are_known() -> None:
    """llama-server names the slot of every reply (both pinned builds): none at all cannot be credited to a slot."""
    from hostile_http import completion_reply

    from dflashkit.errors import DFlashError
    from dflashkit.llama_cpp.server import Limits, parse_completion

    reply = completion_reply(5, draft=True)
    del reply["id_slot"]
    with pytest.raises(DFlashError) as exc:
        parse_completion(json.dumps(reply).encode(), "llama-server", Limits(5, 15, slots=2))
    assert str(exc.value) == ("llama-server: llama-server reported impossible figures (no id_slot from a server of 2 "
                              "slot(s) (-np 2): its slots are 0 to 1) — refused, not reported")
    assert parse_completion(json.dumps(reply).encode(), "llama-server", Limits(5, 15)).slot is None  # --server-url


def test_check_reads_the_block_size_from_the_files_not_the_record(crashed_release: Path, tmp_path: Path) -> None:
    """A record that claims a block of 4096 for a block-16 drafter cannot hold a τ of 4000 by its own word."""
    def edit(record: dict[str, Any]) -> None:
        record["block_size"] = 4096
        record["jobs"]["BF16"]["tau"].update(mean=4000.0, per_prompt=[4000.0] * len(record["jobs"]["BF16"]["tau"]
                                                                                     ["per_prompt"]))

    forged = _forge(crashed_release, tmp_path, edit)
    res = CliRunner().invoke(release_command, ["--check", str(forged)])
    assert res.exit_code == 1
    gguf_name = json.loads((forged / "release.json").read_text())["jobs"]["BF16"]["file"]
    assert f"{forged / 'release.json'}: block_size is 4096, but {gguf_name} says 16 (its block size bounds every τ of " \
           "the record)" in res.stderr
