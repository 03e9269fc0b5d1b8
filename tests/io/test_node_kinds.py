"""The manifest's node kinds live in one table, _nodes.KINDS (issue 46, item 4)."""

from __future__ import annotations

import ast
import enum
import math
import pathlib
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import _nodes

SRC = Path(jio.__file__).parent


class Color(enum.Enum):
    RED = 1


def _tag_spellings(tree: ast.AST) -> list[str]:
    """Tag words a module spells where a node's tag is meant: a list literal starting with
    one (a node being built), or one compared with ``node[0]`` or ``tag``."""
    found: list[str] = []

    def words(expr: ast.AST) -> list[str]:
        items = expr.elts if isinstance(expr, (ast.Tuple, ast.Set, ast.List)) else [expr]
        return [
            item.value
            for item in items
            if isinstance(item, ast.Constant) and item.value in _nodes.TAGS
        ]

    def is_tag(expr: ast.AST) -> bool:
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
            return expr.slice.value == 0
        return isinstance(expr, ast.Name) and expr.id == "tag"

    for node in ast.walk(tree):
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant):
            found += words(node.elts[0])
        elif isinstance(node, ast.Compare) and is_tag(node.left):
            for comparator in node.comparators:
                found += words(comparator)
    return found


@pytest.mark.parametrize("module", sorted(p.stem for p in SRC.glob("*.py") if p.stem != "_nodes"))
def test_no_module_but_nodes_spells_a_tag(module: str) -> None:
    """Tags are _nodes' constants everywhere else (building nodes, reading them)."""
    tree = ast.parse((SRC / f"{module}.py").read_text(encoding="utf-8"))
    assert _tag_spellings(tree) == []


def test_the_checker_finds_a_spelled_tag() -> None:
    """The check above sees a node built with a literal tag and a literal compared with one."""
    tree = ast.parse("x = ['int', 3]\nif node[0] == 'dict': pass\nif tag in ('set',): pass\n")
    assert _tag_spellings(tree) == ["int", "dict", "set"]


def test_every_node_the_encoder_writes_is_a_kind_of_the_table() -> None:
    """A value holding every kind of leaf and container encodes to tags of KINDS only."""
    value = {
        "scalars": [None, True, 3, 1 << 60, 1.5, math.inf, 2j, "s", b"b"],
        "more": (frozenset({1}), {2}, pathlib.PurePosixPath("/x"), np.float32(1), Color.RED),
        "arrays": np.ones(2),
        "types": np.float32,
    }
    state = jio.to_state_dict(value)
    tags = {node[0] for node in state["manifest"]["nodes"]}
    assert tags <= _nodes.TAGS
    assert {"none", "bool", "int", "float", "complex", "str", "bytes", "path"} <= tags


@pytest.mark.parametrize("key", ["lr", 3, 1 << 60, -(1 << 60), 0.5, math.inf, True, None])
def test_key_value_reads_back_every_scalar_key_the_encoder_writes(key: Any) -> None:
    """Each scalar a dict key may be comes back from its stored node as the same value."""
    state = jio.to_state_dict({key: 1})
    nodes = state["manifest"]["nodes"]
    key_node = nodes[nodes[-1][1][0]]
    assert key_node[0] in _nodes.KEY_TAGS
    found = _nodes.key_value(key_node)
    assert found == key and type(found) is type(key)


def test_key_value_refuses_what_is_no_scalar_key() -> None:
    """A tuple key, a malformed node and a list where a tag should be are no scalar keys."""
    for node in (["tuple", [0]], ["int"], ["int", "0xzz"], [["int"], 1], [], "int"):
        assert _nodes.key_value(node) is _nodes.NOT_A_KEY


def test_a_target_matches_stored_float_and_none_keys(tmp_path: Path) -> None:
    """A restore target names a stored dict's float and None keys like its str keys."""
    path = jio.export({0.5: np.ones(2), None: np.zeros(1), "w": np.arange(2)}, tmp_path / "ck")
    back = jio.load(path, target={0.5: None, None: None, "w": None})
    assert list(back) == [0.5, None, "w"]
    np.testing.assert_array_equal(back[0.5], np.ones(2))
