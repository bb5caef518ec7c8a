"""The package's import layering: every dflashkit module imports only from its own layer or below.

The layer of each module is declared here (most specific prefix wins); a module missing from the table fails the
test, so a new module must be placed deliberately. Imports are read with ast (nothing is imported), including
function-level (lazy) imports: a lazy upward import is still an upward dependency.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dflashkit"

#: lower number = lower layer. A module may import from its own layer or any lower one.
LAYERS: dict[str, int] = {
    "dflashkit": 0,  # the package __init__
    "dflashkit.errors": 0,
    "dflashkit._numba_cache": 0,  # where numba keeps compiled kernels (set before the codecs import numba)
    "dflashkit.spec": 0,
    "dflashkit.causality": 0,
    "dflashkit.divergences": 0,  # the audit's rows where llama.cpp runs a GGUF otherwise than its reference  # causality inside the block: a reference's per-layer rule, llama.cpp's one flag
    "dflashkit.files": 0,
    "dflashkit.bounds": 0,
    "dflashkit.templates": 0,  # a chat template rendered bounded (time, memory, output)
    "dflashkit.sweeps": 0,  # --context / --parallel levels, parsed once for every command (no torch)
    "dflashkit.reporting": 0,
    "dflashkit.quant_types": 0,
    "dflashkit.stats": 0,  # paired bootstrap intervals over prompts (accept, serving)  # ggml types and their sizes (the one reader of gguf's GGML_QUANT_SIZES)
    "dflashkit.codecs": 1,  # one module per quant type (codecs/types), their shared loops (codecs/loops)
    "dflashkit.filetypes": 1,  # llama.cpp file types, gathered from the quant types' modules
    "dflashkit.io": 2,
    "dflashkit.families": 3,
    "dflashkit.dialects": 3,
    "dflashkit.drafters": 3,
    "dflashkit.variants": 3,
    "dflashkit.target_rules": 3,
    "dflashkit.spec_checks": 3,  # the spec rules; reads the families' tensor sets
    "dflashkit.converters": 4,
    "dflashkit.inspect": 4,
    "dflashkit.diff": 4,
    "dflashkit.quantize": 4,
    "dflashkit.runtime.kernels": 5,
    "dflashkit.runtime": 5,
    "dflashkit.llama_cpp": 5,  # llama.cpp as a second runtime: its binary, its converter for the target
    "dflashkit.parity": 6,  # dflash-parity: run, stats, result
    "dflashkit.accept": 6,  # dflash-accept: run, result, report, prompts, serving (llama-server)
    "dflashkit.imatrix_collect": 6,  # dflash-imatrix: a drafter's importance matrix from its real draft rounds
    "dflashkit.release": 7,  # dflash-release: a composition of every command's library function
    "dflashkit.cli": 8,
    }


#: a family folder's own modules sit in the layer of what they extend: its inspect checks with the inspect
#: package, its PyTorch block with the runtime (the registry never imports them)
FAMILY_FOLDER_MODULES: dict[str, int] = {"checks": 4, "runtime": 5}


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 4 and parts[:2] == ["dflashkit", "families"] and parts[3] in FAMILY_FOLDER_MODULES:
        return FAMILY_FOLDER_MODULES[parts[3]]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every dflashkit import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    package_parts = module.split(".") if is_pkg else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dflashkit"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "dflashkit":
                continue
            # `from pkg import submodule` depends on the submodule
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                sub = PACKAGE.parent.joinpath(*candidate.split("."))
                found.append((node.lineno, candidate if sub.with_suffix(".py").exists() or sub.is_dir() else target))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_declared_layer() -> None:
    missing = [module_name(p) for p in MODULES if layer_of(module_name(p)) is None]
    assert not missing, f"declare a layer for: {missing}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_upward_import(path: Path) -> None:
    module = module_name(path)
    own = layer_of(module)
    upward = sorted(
        {
            f"line {line}: {target} (layer {layer_of(target)})"
            for line, target in imported_modules(path, module)
            if own is not None and (layer_of(target) or 0) > own
        }
    )
    assert not upward, f"{module} (layer {own}) imports from a higher layer: {upward}"


def test_no_import_circles() -> None:
    graph: dict[str, set[str]] = {}
    names = {module_name(p) for p in MODULES}
    for path in MODULES:
        module = module_name(path)
        deps = set()
        for _, target in imported_modules(path, module):
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):
                deps.add(target)
        graph[module] = deps
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    # guard against a checker that passes everything: an io module importing the cli must be flagged
    fake = PACKAGE / "io" / "gguf_reader.py"
    src = "from ..cli import main\nimport dflashkit.parity\n"
    target = tmp_path / "x.py"
    target.write_text(src)
    found = [t for _, t in imported_modules(target, "dflashkit.io.gguf_reader")]
    assert "dflashkit.cli" in found[0] or found[0].startswith("dflashkit.cli")
    assert any(t.startswith("dflashkit.parity") for t in found)
    assert all(layer_of(t) > layer_of("dflashkit.io.gguf_reader") for t in found)
    assert fake.exists()


def test_the_measuring_commands_are_packages() -> None:
    # dflash-accept and dflash-parity live in their packages, like diff/ and release/; no module of the old layout
    # is left at the root, not even an alias (dflashkit.serving, an alias of accept.serving, is gone)
    assert (PACKAGE / "accept").is_dir() and (PACKAGE / "parity").is_dir()
    loose = sorted(p.name for p in PACKAGE.glob("*.py")
                   if p.stem.startswith(("accept", "parity", "prompts", "serving")))
    assert loose == []
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dflashkit.serving")