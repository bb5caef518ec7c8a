"""A drafter family is a folder: the registry fills itself, and nothing outside ``dflashkit/families/`` names a family.

"Names a family" (comments and docstrings aside; read with ast, nothing is imported for the scan):
- an identifier that contains a family folder's name or a word only one family line uses (``dspark``, ``dflash2``);
- a string literal that contains an architecture string a family claims, a family-only tensor id (the canonical ids
  a family adds to llama.cpp's tensor table), or a family-only word; or that *is* a family's name or checkpoint
  layout.
Strings in ``__all__`` name Python objects (the shared ``DFlashDraftModel`` block), not architectures, and are not read.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dflashkit.families as families

PACKAGE = Path(families.__file__).resolve().parents[1]
FAMILY_WORDS = ("dspark", "dflash2")


def _family_facts() -> tuple[set[str], set[str], set[str]]:
    """(substrings forbidden in identifiers, substrings forbidden in strings, exact strings forbidden)."""
    folders = {p.name for p in (PACKAGE / "families").iterdir() if (p / "__init__.py").exists()}
    in_names = {w.lower() for w in folders | set(FAMILY_WORDS)}
    in_strings = set(FAMILY_WORDS)
    exact: set[str] = set()
    for f in families.FAMILIES:
        in_strings |= set(f.architectures)
        exact |= {f.name, *(x for x in f.labels if x and x != "llama.cpp")}
        layout = getattr(f, "layout", None)
        if isinstance(layout, str):
            exact.add(layout)
        in_strings |= set(type(f).__dict__.get("llama_cpp_tensor_names", {}))
    return in_names, in_strings, exact


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _all_strings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            out |= {id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant)}
    return out


def family_names_in(path: Path) -> list[str]:
    in_names, in_strings, exact = _family_facts()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree) | _all_strings(tree)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        for name in names:
            if any(w in name.lower() for w in in_names):
                found.append(f"line {node.lineno}: identifier {name}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            s = node.value
            hit = [w for w in in_strings if w.lower() in s.lower()] or ([s] if s in exact else [])
            if hit:
                found.append(f"line {node.lineno}: string {s[:60]!r} ({hit[0]})")
    return found


def test_nothing_outside_the_family_folders_names_a_family() -> None:
    offenders = {
        str(p.relative_to(PACKAGE.parent)): hits
        for p in sorted(PACKAGE.rglob("*.py"))
        if "families" not in p.relative_to(PACKAGE).parts
        for hits in [family_names_in(p)] if hits
    }
    assert not offenders, f"family knowledge outside dflashkit/families/: {offenders}"


def test_the_scan_sees_a_family_named_outside(tmp_path: Path) -> None:
    # guard against a scan that passes everything: each kind of naming is caught, comments and docstrings are not
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent('''
        """A docstring may say DSparkDraftModel."""
        # a comment may say dspark
        from dflashkit.families.dspark import DSpark
        def run(spec):
            if spec.family == "dflash2":
                return "markov_head.markov_w1.weight"
            if spec.layout == "speculators":
                return "Gemma4DSparkModel"
        '''))
    hits = family_names_in(bad)
    assert len(hits) == 6, hits
    assert not any("line 2" in h or "line 3" in h for h in hits)


def test_every_family_is_a_registered_folder() -> None:
    folders = sorted(p.name for p in (PACKAGE / "families").iterdir() if (p / "__init__.py").exists())
    modules = sorted({type(f).__module__.rpartition(".")[2] for f in families.FAMILIES})
    assert folders == modules
    order = [f.name for f in families.FAMILIES]
    # a layout told apart by config shape is asked before the family that claims the same architecture by name
    for shaped, named in (("speculators-dspark", "dspark"), ("speculators-dflash", "zlab-dflash"),
                          ("speculators-dflash2", "zlab-dflash2")):
        assert order.index(shaped) < order.index(named), order
    assert families.DEFAULT_FAMILY.name == "zlab-dflash"
    for module in families.folder_modules("runtime") + families.folder_modules("checks"):
        assert (PACKAGE.parent / (module.replace(".", "/") + ".py")).is_file(), module


TOY_FAMILY = '''
"""A throw-away family: z-lab DFlash under another architecture string, with one tensor of its own."""
from ..base import DrafterFamily
from ..zlab_dflash import ZLabDFlash


class ThrowAwayDFlash(ZLabDFlash):
    name = "throwaway-dflash"
    priority = 25
    default = False
    plain_runtime = False
    architectures = ("ThrowAwayDFlashDraftModel",)
    labels = {"zlab": "Throw-away DFlash", "llama.cpp": "Throw-away DFlash (llama.cpp GGUF)"}
    llama_cpp_tensor_names = {"throwaway_head.weight": "throwaway_head.weight"}

    def matches_gguf(self, fields):
        return False


FAMILY = ThrowAwayDFlash.instance
'''

TOY_CHECK = '''
import json, sys
from dflashkit import dialects, families
from dflashkit.families import read_hf_config, label_for
config = json.load(open(sys.argv[1]))
family, spec = read_hf_config(config)
print(family.name, spec.architecture)
print("throwaway_head.weight" in dialects.LLAMA_CPP.tensor_names, dialects.LLAMA_CPP.gguf_name("throwaway_head.weight"))
print(label_for(spec.architecture, None, "zlab"))
names = [f.name for f in families.FAMILIES]
print(names.index("throwaway-dflash") < names.index("zlab-dflash"))
'''


def test_adding_a_family_is_one_folder(tmp_path: Path) -> None:
    # a copy of the package with one more folder under families/: the registry, the dialect table and the reports
    # know the family without another file touched
    import json
    import shutil

    root = tmp_path / "pkg"
    shutil.copytree(PACKAGE, root / "dflashkit", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "dflashkit" / "families" / "throwaway_dflash").mkdir()
    (root / "dflashkit" / "families" / "throwaway_dflash" / "__init__.py").write_text(TOY_FAMILY)
    (tmp_path / "check.py").write_text(TOY_CHECK)
    zlab_config = json.loads((PACKAGE.parent / "fixtures" / "trained" / "drafter" / "config.json").read_text())
    config = dict(zlab_config, architectures=["ThrowAwayDFlashDraftModel"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = dict(os.environ, PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, str(tmp_path / "check.py"), str(tmp_path / "config.json")],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "throwaway-dflash ThrowAwayDFlashDraftModel", "True throwaway_head.weight", "Throw-away DFlash", "True",
    ]
