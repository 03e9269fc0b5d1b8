"""jaxstruct.io stands in floors that import only downward (issue 21, item 9)."""

from __future__ import annotations

import ast
from pathlib import Path

import jaxstruct.io as jio

FLOORS = [
    {"_process", "_budget", "_pieces", "_zip", "_jax_private", "_multihost", "_host"},
    {"_schema", "_checksums", "_nodes", "_values", "_formats", "hookspecs"},
    {"_npz", "_builtin", "_tables", "_plugin_checks", "_plugins", "_contract", "_publish"},
    {"_encode", "_targets", "_decode", "_plain", "_async"},
    {"_export", "_load", "_state", "_inspect"},
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


def test_one_module_owns_the_node_kinds() -> None:
    """Decoding has a handler for every node kind _nodes lists and for no other, and
    inspect describes each of them."""
    from jaxstruct.io import _decode, _inspect, _nodes

    assert set(_decode._HANDLERS) == _nodes.TAGS
    arrays = {"a0": ("<f4", (2,), 8)}
    samples = {
        "array": ["array", "a0"],
        "jaxarray": ["jaxarray", "a0"],
        "prngkey": ["prngkey", "a0", "threefry2x32"],
        "struct": ["struct", "m:C", 0, {}],
        "pytree": ["pytree", "m:C", "j", 0, []],
        "namedtuple": ["namedtuple", "m:C", []],
        "dict": ["dict", []],
        "enum": ["enum", "m:E", "A"],
        "codec": ["codec", "c", 0],
        "mapping": ["mapping", "m:M", 0],
        "scalartype": ["scalartype", "jax", "float32"],
        "class": ["class", "m:C"],
        "path": ["path", "PurePosixPath", "/x"],
        "npscalar": ["npscalar", "<f4", "00000000"],
        "complex": ["complex", 1.0, 2.0],
        "callable": ["callable", "m:f"],
        "none": ["none"],
    }
    for tag in sorted(_nodes.TAGS):
        node = samples.get(tag, [tag, [] if tag in _nodes.SEQUENCES else "x"])
        label, _ = _inspect._describe(node, arrays, [["int", 0], node])
        assert label, tag
