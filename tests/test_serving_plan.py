"""Serving is prepared once: `plan_serving` checks every llama-server option (each message written once, in
``accept/serving_plan.py``), and what measures — `measure_serving`, `serve_files`, a release's serving step — runs
the plan it is given without checking it again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import standin_server
from dflashkit.accept import serving_plan
from dflashkit.accept.serving_measure import measure_serving
from dflashkit.accept.serving_plan import ServingPlan, plan_serving
from dflashkit.errors import UsageError

PACKAGE = Path(serving_plan.__file__).resolve().parents[1]
TEXTS, NAMES = ["Say hello.", "Count to three."], ["a", "b"]


def _literal_text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # an f-string: its literal parts, the fields as {}
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return ""


def _files_saying(phrase: str) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        texts = [_literal_text(n) for n in ast.walk(tree) if isinstance(n, (ast.Constant, ast.JoinedStr))]
        if any(phrase in t for t in texts):
            found.append(str(path.relative_to(PACKAGE)))
    return found


@pytest.mark.parametrize("phrase", [
    "needs the target as a GGUF: pass --target-gguf FILE",
    "--target-gguf {}: no such file",
    "tokens a round (block size",
    "give one of --llama-server BIN_DIR",
    "starts its own servers, --server-url asks a running one",
    "--baseline-url is the target alone beside --server-url",
    "are set where the server starts: with --server-url",
    "llama-server drafts only with 2 tokens still to generate",
    "give at least one drafter to measure through llama-server",
    "--llama-cpp-arg goes to the llama.cpp processes dflashkit starts",
    "the target alone must be a second server",
    "--parallel starts llama-server with -np N",
])
def test_each_serving_check_is_written_once(phrase: str) -> None:
    assert _files_saying(phrase) == ["accept/serving_plan.py"]


def test_the_scan_reads_f_strings() -> None:
    # a message built as an f-string is found by its literal parts, the fields read as {}: a copy elsewhere would be
    assert _files_saying("drafts at most {} tokens a round (block size {}") == ["accept/serving_plan.py"]


def test_a_plan_is_checked_once_and_run_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = standin_server.make(tmp_path / "bin")
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    plan = plan_serving([("d.gguf", 16)], llama_server=folder, target_ggufs=[target], draft_n_max=[4, 15],
                        max_new_tokens=33, llama_cpp_args=["--no-repack"])
    assert plan == ServingPlan(str(folder), None, None, (str(target),), (4, 15), (None,), 33, 0, 1, ("--no-repack",),
                               plan.timeout, ())

    def checked_again(*args: object, **kw: object) -> None:
        raise AssertionError("the plan was checked again")

    monkeypatch.setattr("dflashkit.accept.serving_measure.plan_serving", checked_again)
    result = measure_serving([("d.gguf", tmp_path / "d.gguf", 16)], TEXTS, NAMES, plan)
    assert [(r.draft_n_max, len(r.on), len(r.off)) for r in result.runs] == [(4, 2, 2), (15, 2, 2)]
    with pytest.raises(TypeError, match="pass the options in the plan, not as max_new_tokens"):
        measure_serving([("d.gguf", tmp_path / "d.gguf", 16)], TEXTS, NAMES, plan, max_new_tokens=8)


def test_a_bad_option_is_refused_before_any_server_starts(tmp_path: Path) -> None:
    folder = standin_server.make(tmp_path / "bin")
    with pytest.raises(UsageError, match=r"^--llama-server needs the target as a GGUF"):
        plan_serving([("d.gguf", 16)], llama_server=folder)
    with pytest.raises(UsageError, match=r"^--max-new-tokens 2: llama-server drafts only"):
        plan_serving([("d.gguf", 16)], llama_server=folder, target_ggufs=[], max_new_tokens=2)
    with pytest.raises(UsageError, match=r"^--draft-n-max 16: d.gguf drafts at most 15 tokens a round"):
        plan_serving([("d.gguf", 16)], llama_server=folder, draft_n_max=[16], target_ggufs_later=True)
    with pytest.raises(UsageError, match=r"^--parallel starts llama-server"):
        plan_serving([("d.gguf", 16)], server_url="http://127.0.0.1:1", parallel=[2])
    assert standin_server.pids(folder) == []
