"""jaxstruct.io stands in floors that import only downward (issue 21, item 9)."""

from __future__ import annotations

import ast
from pathlib import Path

import jaxstruct.io as jio

FLOORS = [
    {"_fs", "_zip", "_jax_private", "_multihost", "_host"},
    {"_schema", "_values", "_formats", "hookspecs"},
    {"_npz", "_builtin", "_plugins", "_detect"},
    {"_encode", "_targets", "_decode", "_plain"},
    {"_checkpoint", "_async", "_state", "_inspect"},
    {"_manager", "_cli", "__init__"},
]
SRC = Path(jio.__file__).parent


def _imports(path: Path) -> set[str]:
    """The package's own modules that ``path`` imports (at any depth of its code)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxstruct.io."):
            found.add((node.module or "").split(".")[2])
    return found


def test_every_module_has_a_floor() -> None:
    """Each module of the package is in exactly one floor, and every floor's module exists."""
    modules = {p.stem for p in SRC.glob("*.py")}
    listed = [name for floor in FLOORS for name in floor]
    assert sorted(listed) == sorted(modules)


def test_modules_import_only_their_floor_or_below() -> None:
    """No module imports one of a higher floor."""
    level = {name: i for i, floor in enumerate(FLOORS) for name in floor}
    upward = [
        f"{path.stem} (floor {level[path.stem]}) imports {name} (floor {level[name]})"
        for path in sorted(SRC.glob("*.py"))
        for name in sorted(_imports(path))
        if name in level and level[name] > level[path.stem]
    ]
    assert upward == []
