"""What the compare tools share: the outputs of the working tree and of a git revision, the revision checked out in
a temporary worktree beside the inputs and removed afterwards (``compare_outputs``, ``compare_reports``)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]

#: ``outputs(code, inputs, out)``: what the code tree ``code`` makes of ``inputs``, written under ``out``
Outputs = Callable[[Path, Path, Path], dict[str, str]]


def ref_and_now(ref: str, work: Path, outputs: Outputs) -> tuple[dict[str, str], dict[str, str]]:
    """``outputs`` of revision ``ref`` and of the working tree, both on ``work/in`` (built by the caller)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(work / "ref"), ref], check=True)
    try:
        return outputs(work / "ref", work / "in", work / "out-ref"), outputs(ROOT, work / "in", work / "out-now")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "ref")], check=False)
