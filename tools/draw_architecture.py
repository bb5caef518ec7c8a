"""Draw dflashkit's layers from its imports: the Mermaid picture in docs/architecture.md.

    python tools/draw_architecture.py            # print the picture
    python tools/draw_architecture.py --write    # put it into docs/architecture.md (between its markers)

Each module's layer is the one tests/test_layers.py declares (the table that test enforces); the imports are read
with ast, as that test reads them. A node per layer lists its units (a top-level module or subpackage; a family
folder's ``checks`` / ``runtime`` modules apart, as plugins); an arrow from a layer to a lower one counts the
unit-level imports between them. tests/test_architecture.py checks the committed picture is this script's output.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- architecture:begin (tools/draw_architecture.py) -->", "<!-- architecture:end -->"


def _layers_module():
    spec = importlib.util.spec_from_file_location("test_layers", ROOT / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("test_layers", module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def unit_of(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "dflashkit"
    if parts[0] == "families" and len(parts) == 3 and parts[2] in ("checks", "runtime"):
        return f"families/*/{parts[2]}"
    return parts[0] + ("/" if (ROOT / "dflashkit" / parts[0]).is_dir() else "")


def picture() -> str:
    t = _layers_module()
    units: dict[int, set[str]] = collections.defaultdict(set)
    edges: collections.Counter[tuple[int, int]] = collections.Counter()
    seen: set[tuple[str, str]] = set()
    for path in t.MODULES:
        module = t.module_name(path)
        layer, unit = t.layer_of(module), unit_of(module)
        units[layer].add(unit)
        for _, target in t.imported_modules(path, module):
            other = unit_of(target)
            if other != unit and (unit, other) not in seen:
                seen.add((unit, other))
                edges[(layer, t.layer_of(target) or 0)] += 1
    lines = ["```mermaid", "graph BT"]
    for layer in sorted(units):
        names = ", ".join(sorted(units[layer]))
        lines.append(f'  L{layer}["layer {layer}: {names}"]')
    for (a, b), n in sorted(edges.items()):
        if a != b:
            lines.append(f"  L{a} -->|{n}| L{b}")
    lines.append("```")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"replace the picture in {DOC.relative_to(ROOT)}")
    args = ap.parse_args()
    pic = picture()
    if not args.write:
        print(pic, end="")
        return
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{pic}{END}{tail}")


if __name__ == "__main__":
    main()
