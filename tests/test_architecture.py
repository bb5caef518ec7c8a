"""docs/architecture.md's picture is what tools/draw_architecture.py draws from the code today (it cannot go stale)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_picture_is_drawn_from_the_code() -> None:
    drawn = subprocess.run([sys.executable, str(ROOT / "tools" / "draw_architecture.py")], capture_output=True,
                           text=True, check=True).stdout
    doc = (ROOT / "docs" / "architecture.md").read_text()
    begin = "<!-- architecture:begin (tools/draw_architecture.py) -->\n"
    committed = doc.split(begin, 1)[1].split("<!-- architecture:end -->", 1)[0]
    assert committed == drawn, "run: python tools/draw_architecture.py --write"
    assert drawn.startswith("```mermaid\ngraph BT\n") and '"layer 8: cli/"' in drawn
