"""Structs holding flax NNX modules export and load in every format (issue 36, item 8)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError

# The peers group: absent only in the lowest-versions runs (conftest allows the skip there).
nnx = pytest.importorskip("flax.nnx")

SUFFIX = {"directory": "", "zip": ".zip", "tar": ".tar", "orbax": "", "safetensors": ".safetensors"}
NEEDS_FUNCTIONS = ["jax", "flax"]  # the modules defining nnx.Linear's dot_general, promote_dtype


class Holder(js.Struct):
    model: Any
    step: int = 0


def _linear(seed: int) -> Any:
    return nnx.Linear(2, 3, param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


def _same_model(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    x = jnp.arange(2.0)
    np.testing.assert_array_equal(np.asarray(a(x)), np.asarray(b(x)))
    assert (a.in_features, a.out_features, a.param_dtype) == (2, 3, jnp.float32)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_an_nnx_module_round_trips_with_a_target(fmt: str, tmp_path: Path) -> None:
    """A struct holding an nnx.Linear loads into nnx.eval_shape of it, and into a freshly
    built model, in every format; the result runs under jit (its static data hashes)."""
    saved = Holder(_linear(0), step=3)
    path = jio.export(saved, tmp_path / f"ck{SUFFIX[fmt]}", format=fmt)
    for target in (
        Holder(nnx.eval_shape(lambda: _linear(1))),
        Holder(_linear(1)),
    ):
        back = jio.load(path, target=target)
        assert back.step == 3
        _same_model(back.model, saved.model)
        x = jnp.ones(2)
        np.testing.assert_array_equal(jax.jit(lambda h, x=x: h.model(x))(back), saved.model(x))


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_an_nnx_module_loads_without_a_target_when_its_modules_are_allowed(
    fmt: str, tmp_path: Path
) -> None:
    """Without a target, the module's functions (dot_general) come from the modules the user
    allowed, and only from them: without allow_imports the error says how to load it."""
    saved = Holder(_linear(0))
    path = jio.export(saved, tmp_path / f"ck{SUFFIX[fmt]}", format=fmt)
    with pytest.raises(SerializationError, match=r"dot_general.*nnx\.eval_shape.*allow_imports"):
        jio.load(path)
    back = jio.load(path, allow_imports=NEEDS_FUNCTIONS)
    _same_model(back.model, saved.model)


def _tamper(path: Path, change: Any) -> Path:
    doc = json.loads((path / "manifest.json").read_text())
    change(doc["manifest"]["nodes"])
    doc.pop("checksum", None)  # edited on purpose: a stale checksum would fail first
    (path / "manifest.json").write_bytes(jio.seal_manifest(doc))
    return path


def _nodes_tagged(nodes: list[Any], tag: str) -> list[list[Any]]:
    return [n for n in nodes if n[0] == tag]


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_an_nnx_optimizer_round_trips_with_a_target(fmt: str, tmp_path: Path) -> None:
    """An nnx.Optimizer (its wrt= filter is a class, its optax transformation functions)
    loads into a freshly built one and into nnx.eval_shape of one."""
    optax = pytest.importorskip("optax")

    def make(seed: int) -> Holder:
        model = _linear(seed)
        return Holder((model, nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)), step=2)

    saved = make(0)
    path = jio.export(saved, tmp_path / f"ck{SUFFIX[fmt]}", format=fmt)
    for target in (make(1), nnx.eval_shape(lambda: make(1))):
        back = jio.load(path, target=target)
        _same_model(back.model[0], saved.model[0])
        assert type(back.model[1]) is nnx.Optimizer and back.model[1].wrt is nnx.Param
        for u, v in zip(jax.tree.leaves(back), jax.tree.leaves(saved), strict=True):
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_a_stored_class_is_found_only_by_the_loading_rules(tmp_path: Path) -> None:
    """A class node naming something that is not a known class is refused, even with its
    module allowed (a function is no class)."""
    saved = Holder(nnx.Optimizer(_linear(0), __import__("optax").sgd(0.1), wrt=nnx.Param))
    path = jio.export(saved, tmp_path / "ck")
    _tamper(path, lambda nodes: _nodes_tagged(nodes, "class")[0].__setitem__(1, "os:system"))
    with pytest.raises(SerializationError, match="'os:system' is not known"):
        jio.load(path, target=Holder(saved.model))
    with pytest.raises(SerializationError, match="os:system"):
        jio.load(path, target=Holder(saved.model), allow_imports=["os"])


def test_stored_function_names_resolve_only_to_functions_of_allowed_modules(
    tmp_path: Path,
) -> None:
    """A file naming a class, a function of a module not allowed, or a missing one is
    refused even with allow_imports."""
    saved = Holder(_linear(0))
    for ref in ("jax.numpy:ndarray", "os:system", "jax._src.lax.lax:nope"):
        path = jio.export(saved, tmp_path / f"ck{len(ref)}{ref[:3]}")

        def rename(nodes: list[Any], ref: str = ref) -> None:
            _nodes_tagged(nodes, "callable")[0][1] = ref

        _tamper(path, rename)
        with pytest.raises(SerializationError, match="never store code"):
            jio.load(path, allow_imports=NEEDS_FUNCTIONS)


def test_scalar_types_and_mappings_are_rebuilt_only_from_known_names(tmp_path: Path) -> None:
    """A scalar type node naming something else than a scalar type, or a mapping node naming
    a class other than the known immutable mappings, is refused by name."""
    saved = Holder(_linear(0))
    path = jio.export(saved, tmp_path / "types")
    _tamper(path, lambda nodes: _nodes_tagged(nodes, "scalartype")[0].__setitem__(2, "ndarray"))
    with pytest.raises(SerializationError, match="has no scalar type 'ndarray'"):
        jio.load(path, allow_imports=NEEDS_FUNCTIONS)
    path = jio.export(saved, tmp_path / "mapping")
    _tamper(path, lambda nodes: _nodes_tagged(nodes, "mapping")[0].__setitem__(1, "os:environ"))
    with pytest.raises(SerializationError, match="'os:environ' is not one loading rebuilds"):
        jio.load(path, allow_imports=NEEDS_FUNCTIONS)


def test_scalar_types_round_trip_as_static_fields(tmp_path: Path) -> None:
    """NumPy and jax.numpy scalar types (a dtype argument) are stored by name and come back
    as the same objects; inspect shows them."""

    class Config(js.Struct):
        dtypes: tuple = js.field(static=True)

    value = Config((jnp.bfloat16, jnp.float32, np.int8, np.float64))
    path = jio.export(value, tmp_path / "ck")
    back = jio.load(path)
    assert all(a is b for a, b in zip(back.dtypes, value.dtypes, strict=True))
    assert "scalar type jax.bfloat16" in jio.inspect(path).tree


def test_mapping_classes_are_never_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading never imports a module for a mapping node: the class is looked up among the
    modules already imported."""
    from jaxstruct.io import _values

    assert _values.known_mapping("flax.typing:HashableMapping") is not None
    monkeypatch.delitem(sys.modules, "flax.typing")
    assert _values.known_mapping("flax.typing:HashableMapping") is None
    assert "flax.typing" not in sys.modules


def test_an_equinox_model_without_a_target_is_told_what_builds_one(tmp_path: Path) -> None:
    """The error for an equinox model holding functions, loaded without a target, advises
    equinox.filter_eval_shape or a freshly built model (jax.eval_shape cannot build one)."""
    eqx = pytest.importorskip("equinox")
    path = jio.export({"mlp": eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))}, tmp_path / "ck")
    with pytest.raises(SerializationError) as info:
        jio.load(path)
    assert "equinox.filter_eval_shape" in str(info.value)
    assert "freshly built model" in str(info.value)
    target = eqx.filter_eval_shape(lambda: {"mlp": eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(1))})
    back = jio.load(path, target=target)
    assert isinstance(back["mlp"], eqx.nn.MLP)
