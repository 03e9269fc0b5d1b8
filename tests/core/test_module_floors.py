"""The modules of jaxstruct.core import each other in floors, never in a circle (issue 24, item 3).

Every import counts, including one inside a function or under ``TYPE_CHECKING``:
it still ties the two modules together. A package's ``__init__`` importing its
own submodules to re-export them is the one edge left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "packages" / "core" / "src"


def _modules(src: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _targets(name: str, path: Path, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    module = node.module or ""
    if node.level:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        module = ".".join([*base, module] if module else base)
    return [module, *(f"{module}.{alias.name}" for alias in node.names)]


def _graph(src: Path) -> dict[str, set[str]]:
    """Which modules each module imports (a name is cut back to the module defining it)."""
    modules = _modules(src)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(name, path, node):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                reexport = path.name == "__init__.py" and target.startswith(name + ".")
                if target and target != name and not reexport:
                    edges.add(target)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a list of modules), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_core_has_no_import_cycle() -> None:
    """No chain of imports inside jaxstruct.core leads back to where it started."""
    cycle = _cycle(_graph(CORE))
    assert cycle is None, " -> ".join(cycle or [])


def test_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    """The finder reports a cycle through a function-level and a TYPE_CHECKING import."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\nA = 1\n"
    )
    (pkg / "b.py").write_text("def f():\n    from .a import A\n    return A\nB = 2\n")
    assert _cycle(_graph(tmp_path)) == ["pkg.a", "pkg.b", "pkg.a"]


def _runtime_imports(path: Path) -> set[str]:
    """Relative imports executed when ``path`` runs (not those under ``if TYPE_CHECKING:``)."""
    found: set[str] = set()

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for child in node.orelse:
                walk(child)
            return
        if isinstance(node, ast.ImportFrom) and node.level:
            found.add(node.module or "")
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(ast.parse(path.read_text(encoding="utf-8")))
    return found


@pytest.mark.parametrize("module", ["_struct.py", "_meta.py", "_codegen.py", "_lifecycle.py"])
def test_struct_floor_never_runs_the_selection_layer(module: str) -> None:
    """Struct and what it is built from never import _select at run time: selectors sit on top."""
    imports = _runtime_imports(CORE / "jaxstruct" / "core" / module)
    assert not any(m == "_select" or m.startswith("_select.") for m in imports), imports


def test_struct_select_reaches_the_selection_layer_by_name() -> None:
    """Struct.select finds the selection layer when called: nothing is installed into
    _struct at import time (no function of the layer above is handed down)."""
    import jaxstruct.core as js
    from jaxstruct.core import _struct

    class P(js.Struct):
        a: int

    assert isinstance(P(a=1).select(), js.Selection)
    assert not any(
        callable(v) and str(getattr(v, "__module__", "")).startswith("jaxstruct.core._select")
        for v in vars(_struct).values()
    )
