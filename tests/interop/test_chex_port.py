"""A chex library ported to jaxstruct by the documented rewrite runs as before (issue 37).

``chex_port/search_chex.py`` is a small tree-search library written for chex
(frozen ``@chex.dataclass`` classes, a generic ``Tree[T]`` updated with
``replace`` in a ``fori_loop``, the mapping habits ``o["k"]``, ``keys()``,
``items()``, ``**o`` and ``to_tuple()``); ``chex_port/search_port.py`` is the
same file after the rewrite docs/coming-from.md gives, and nothing else. Both
run the same search to bit-identical outputs, compared by field name: chex
flattens fields sorted by name, jaxstruct in declaration order, and leaves
saved by position from the chex version are restored by name with the
recipe the docs give.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

chex = pytest.importorskip("chex")
import jaxstruct.core as js  # noqa: E402

HERE = Path(__file__).resolve().parent / "chex_port"

#: The rewrite docs/coming-from.md gives for a chex library, rule by rule (besides
#: importing jaxstruct.core as js).
REWRITE = [
    (r"@chex\.dataclass\(frozen=True\)", "@js.dataclass(frozen=True)"),
    (r'(\w+)\["(\w+)"\]', r"\1.\2"),
    (r"(\w+)\.(keys|values|items)\(\)", r"\1.to_dict().\2()"),
    (r"\*\*(\w+)([,)}])", r"**\1.to_dict()\2"),
    (r"(\w+)\.to_tuple\(\)", r"tuple(\1.to_dict().values())"),
]


def documented_rewrite(source: str) -> str:
    """The rewrite docs/coming-from.md gives for a chex library (and nothing more)."""
    for pattern, replacement in REWRITE:
        source = re.sub(pattern, replacement, source)
    return source.replace(
        "import jax.numpy as jnp\n", "import jax.numpy as jnp\nimport jaxstruct.core as js\n", 1
    )


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"chex_port_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # string annotations resolve in it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def libs() -> dict[str, ModuleType]:
    return {"chex": _load("search_chex"), "port": _load("search_port")}


def test_the_port_is_the_documented_rewrite_and_nothing_else() -> None:
    original = (HERE / "search_chex.py").read_text(encoding="utf-8")
    assert (HERE / "search_port.py").read_text(encoding="utf-8") == documented_rewrite(original)


def test_the_port_defines_generic_structs(libs: dict[str, ModuleType]) -> None:
    port = libs["port"]
    for name in ("RootFnOutput", "RecurrentFnOutput", "Tree", "SearchSummary", "PolicyOutput"):
        assert issubclass(getattr(port, name), js.Struct)
    assert port.Tree.__parameters__ == (port.T,) == port.PolicyOutput.__parameters__
    assert port.Tree[dict] is not None and port.PolicyOutput[jax.Array] is not None


def _model(batch: int = 3, actions: int = 4) -> tuple[Any, Any]:
    """A user's model: the root's outputs and a recurrent function over a dict embedding."""
    key = jax.random.key(7)
    logits = jax.random.normal(key, (batch, actions))
    embedding = {"state": jnp.arange(batch, dtype=jnp.float32), "depth": jnp.zeros(batch)}

    def recurrent_fn(lib: ModuleType) -> Any:
        def fn(params: Any, key: jax.Array, action: jax.Array, embedding: Any) -> Any:
            noise = jax.random.uniform(key, action.shape)
            moved = action.astype(jnp.float32)
            reward = jnp.cos(embedding["state"] + moved * params) + 0.1 * noise
            out = lib.RecurrentFnOutput(
                reward=reward,
                discount=jnp.full(action.shape, 0.9),
                prior_logits=jnp.zeros((action.shape[0], actions)),
                value=jnp.sin(moved * 0.5),
            )
            return out, embedding

        return fn

    return (logits, embedding), recurrent_fn


def _search(lib: ModuleType) -> Any:
    (logits, embedding), recurrent_fn = _model()
    root = lib.RootFnOutput(prior_logits=logits, value=jnp.ones(3) * 0.5, embedding=embedding)
    run = jax.jit(
        lambda key, root: lib.search(0.3, key, root, recurrent_fn(lib), num_simulations=24)
    )
    return run(jax.random.key(1), root)


def _by_name(tree: Any) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def test_search_outputs_are_bit_identical_by_name(libs: dict[str, ModuleType]) -> None:
    chex_out, port_out = _search(libs["chex"]), _search(libs["port"])
    chex_named, port_named = _by_name(chex_out), _by_name(port_out)
    assert sorted(chex_named) == sorted(port_named)
    for name, value in chex_named.items():
        np.testing.assert_array_equal(port_named[name], value, err_msg=name)
        assert port_named[name].dtype == value.dtype
    assert port_out.search_tree.visits.sum() == 3 * 24


def test_mapping_habits_give_the_same_answers(libs: dict[str, ModuleType]) -> None:
    outs = {which: _search(lib) for which, lib in libs.items()}
    tables = {
        which: libs[which].summary_table(libs[which].summarize(o.search_tree))
        for which, o in outs.items()
    }
    assert tables["chex"] == tables["port"]
    names = {which: libs[which].field_names(o.search_tree) for which, o in outs.items()}
    assert names["chex"] == names["port"]  # declaration order in both
    step = {which: lib.with_value(_step(lib), jnp.zeros(2)) for which, lib in libs.items()}
    assert step["port"].value.tolist() == step["chex"].value.tolist() == [0.0, 0.0]


def _step(lib: ModuleType) -> Any:
    return lib.RecurrentFnOutput(
        reward=jnp.ones(2), discount=jnp.ones(2), prior_logits=jnp.ones((2, 3)), value=jnp.ones(2)
    )


def test_leaves_flatten_sorted_in_chex_and_declared_in_jaxstruct(libs) -> None:
    """What the docs say: chex sorts fields by name, jaxstruct keeps declaration order."""
    names = {
        which: [path[0].name for path, _ in jax.tree_util.tree_flatten_with_path(_step(lib))[0]]
        for which, lib in libs.items()
    }
    assert names["chex"] == ["discount", "prior_logits", "reward", "value"]
    assert names["port"] == ["reward", "discount", "prior_logits", "value"]


def chex_leaf_order(tree: Any) -> list[int]:
    """The recipe of docs/coming-from.md: where chex puts each leaf of ``tree`` when flattening."""

    def sort_key(path: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(getattr(k, "name", getattr(k, "key", getattr(k, "idx", None))) for k in path)

    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    return sorted(range(len(paths)), key=lambda i: sort_key(paths[i]))


def test_leaves_saved_by_position_restore_by_name(libs: dict[str, ModuleType]) -> None:
    """Leaves saved in chex's order go back into the port's fields by name, not by position."""
    chex_out, port_out = _search(libs["chex"]), _search(libs["port"])
    saved = [np.asarray(x) for x in jax.tree.leaves(chex_out)]  # what a chex user saved
    template = port_out
    treedef = jax.tree.structure(template)
    # Restored by position, fields swap (same shapes, wrong places):
    wrong = jax.tree.unflatten(treedef, saved)
    assert not np.array_equal(wrong.search_tree.visits, port_out.search_tree.visits)
    leaves: list[Any] = [None] * len(saved)
    for position, index in enumerate(chex_leaf_order(template)):
        leaves[index] = saved[position]
    restored = jax.tree.unflatten(treedef, leaves)
    for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(port_out), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_frozen_instance_error_clauses_catch_in_both(libs: dict[str, ModuleType]) -> None:
    for lib in libs.values():
        step = _step(lib)
        with pytest.raises(dataclasses.FrozenInstanceError):
            step.reward = jnp.zeros(2)


def test_chex_mapping_habits_exist_in_chex(libs: dict[str, ModuleType]) -> None:
    """What the docs say chex allows (so the table of replacements is about real habits)."""
    step = _step(libs["chex"])
    assert list(step.keys()) == ["reward", "discount", "prior_logits", "value"]
    assert step["reward"] is step.reward
    assert dict(**step)["value"] is step.value
    assert step.to_tuple()[0] is step.reward


def test_chex_differences_the_docs_state() -> None:
    """chex reruns __post_init__ on unflatten, takes keywords only, and makes every field a leaf."""
    calls: list[int] = []

    @chex.dataclass(frozen=True)
    class Checked:
        x: Any
        label: str = "s"

        def __post_init__(self) -> None:
            calls.append(1)

    obj = Checked(x=jnp.ones(2))
    before = len(calls)
    jax.tree.map(lambda v: v, obj)
    assert len(calls) == before + 1
    with pytest.raises(TypeError):
        Checked(jnp.ones(2))
    assert "s" in jax.tree.leaves(obj)

    @js.dataclass(frozen=True)
    class Ported:
        x: Any
        label: str = "s"

        def __post_init__(self) -> None:
            calls.append(1)

    ported = Ported(jnp.ones(2))
    before = len(calls)
    jax.tree.map(lambda v: v, ported)
    assert len(calls) == before
