"""Every format x target kind x leaf restores bit-exactly (issue 20, item 1).

A restore target decides where each array goes; the formats read straight into
those placements. The matrix is every format that takes targets (directory,
zip, the example tar plugin, orbax), every kind of target (none, a
``jax.Array``, a ``jax.ShapeDtypeStruct`` with the saved sharding, one on
another mesh and spec) and every kind of leaf (0-d to 2-d, shapes that do not
divide the mesh, the dtypes users train with, typed PRNG keys, replicated and
sharded over 1-D and 2-D meshes). Nothing here compares with a tolerance:
the bytes must come back.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

FORMATS = ("directory", "zip", "tar", "orbax")
SUFFIX = {"directory": "", "zip": ".zip", "tar": ".tar", "orbax": ""}
DTYPES = (
    np.dtype(np.float32),
    np.dtype(jnp.bfloat16),
    np.dtype(np.float16),
    np.dtype(np.int8),
    np.dtype(np.uint32),
    np.dtype(np.bool_),
    np.dtype(np.complex64),
    np.dtype(np.int32),
)
TARGET_KINDS = ("none", "array", "abstract", "resharded")
MESHES = {"1d": ((8,), ("x",)), "2d": ((2, 4), ("a", "b"))}


def _mesh(name: str) -> jax.sharding.Mesh:
    shape, axes = MESHES[name]
    return jax.make_mesh(shape, axes)


def _values(dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Deterministic values that use every bit pattern class of the dtype (signs, NaN)."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    raw = rng.standard_normal(shape) * 1e3
    if raw.size:
        raw.flat[0] = np.nan if raw.size > 1 else -2.5
    return raw.astype(dtype)


def _spec_for(shape: tuple[int, ...], mesh_name: str, sharded: bool) -> P:
    """Shard each dimension over a mesh axis that divides it; others stay whole."""
    if not sharded or not shape:
        return P()
    sizes, axes = MESHES[mesh_name]
    spec: list[str | None] = []
    free = list(zip(axes, sizes, strict=True))
    for n in shape:
        pick = next(((a, s) for a, s in free if n % s == 0), None)
        spec.append(pick[0] if pick else None)
        if pick:
            free.remove(pick)
    return P(*spec)


def _leaf(kind: str, shape: tuple[int, ...], mesh_name: str, sharded: bool, seed: int) -> Any:
    sharding = NamedSharding(_mesh(mesh_name), _spec_for(shape, mesh_name, sharded))
    if kind == "key":
        keys = jax.random.split(jax.random.key(seed), math.prod(shape)).reshape(shape)
        return jax.device_put(keys, sharding)
    return jax.device_put(_values(np.dtype(kind), shape, seed), sharding)


def _other_sharding(leaf: jax.Array) -> NamedSharding:
    """A sharding on another mesh and spec than ``leaf``'s (sharded where the shape allows)."""
    mesh = jax.make_mesh((4, 2), ("p", "q"))
    spec = P()
    if leaf.ndim >= 1 and leaf.shape[0] % 4 == 0:
        spec = P("p")
    elif leaf.ndim == 2 and leaf.shape[1] % 2 == 0:
        spec = P(None, "q")
    return NamedSharding(mesh, spec)


def _target(state: dict[str, Any], kind: str) -> Any:
    if kind == "none":
        return None
    if kind == "array":
        return state
    if kind == "abstract":
        return jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state
        )
    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=_other_sharding(a)), state
    )


def _bits(a: jax.Array) -> tuple[str, tuple[int, ...], bytes]:
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(a))
        data = np.asarray(jax.random.key_data(a))
        return f"key<{impl}>", a.shape, data.tobytes()
    host = np.asarray(a)
    weak = " (weak)" if a.weak_type else ""  # a weak scalar must not come back strong
    return f"{host.dtype}{weak}", host.shape, host.tobytes()


def _check(state: dict[str, Any], back: Any, kind: str, target: Any) -> None:
    assert isinstance(back, dict) and list(back) == list(state)
    for name, leaf in state.items():
        got = back[name]
        assert isinstance(got, jax.Array), f"{name}: {type(got)}"
        assert _bits(got) == _bits(leaf), f"{name} ({kind} target): bits differ"
        if kind in ("array", "abstract"):
            assert got.sharding.is_equivalent_to(leaf.sharding, leaf.ndim), name
        elif kind == "resharded":
            assert got.sharding.is_equivalent_to(target[name].sharding, leaf.ndim), name


def _roundtrip(fmt: str, state: dict[str, Any], path: Path) -> None:
    jio.export(state, path, format=fmt)
    for kind in TARGET_KINDS:
        target = _target(state, kind)
        _check(state, jio.load(path, target=target), kind, target)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_replicated_scalars_of_every_dtype(fmt: str, mesh_name: str, tmp_path: Path) -> None:
    """0-d arrays of every dtype, a key and weak scalars: each target kind gets the bits.

    (The orbax format once read nothing into a 0-d target and returned garbage,
    and every format returned a weakly typed array strong when it had a target.)
    """
    state = {f"s{i}": _leaf(str(d), (), mesh_name, False, i) for i, d in enumerate(DTYPES)}
    state["step"] = jax.device_put(jnp.array(20, jnp.int32), NamedSharding(_mesh(mesh_name), P()))
    state["key"] = _leaf("key", (), mesh_name, False, 7)
    replicated = NamedSharding(_mesh(mesh_name), P())
    state["lr"] = jax.device_put(jnp.asarray(0.1), replicated)  # weakly typed, as jnp makes it
    state["count"] = jax.device_put(jnp.asarray(3), replicated)
    state["ramp"] = jax.device_put(jax.lax.broadcast(jnp.asarray(2.5), (8,)), replicated)
    assert state["lr"].weak_type and state["count"].weak_type and state["ramp"].weak_type
    _roundtrip(fmt, state, tmp_path / f"ck{SUFFIX[fmt]}")


_SHAPES = ((), (1,), (3,), (8,), (16,), (5, 3), (8, 4), (2, 8), (6, 7))
_KINDS = (*(str(d) for d in DTYPES), "key")


@st.composite
def _states(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    state = {}
    for i in range(n):
        kind = draw(st.sampled_from(_KINDS))
        shape = draw(st.sampled_from(_SHAPES))
        mesh_name = draw(st.sampled_from(sorted(MESHES)))
        sharded = draw(st.booleans())
        state[f"leaf{i}"] = _leaf(kind, shape, mesh_name, sharded, draw(st.integers(0, 99)))
    return state


_counter = itertools.count()


@pytest.mark.parametrize("fmt", FORMATS)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(state=_states())
def test_restore_matrix(fmt: str, state: dict[str, Any], tmp_path: Path) -> None:
    """Any mix of leaves restores bit-exactly into every kind of target, in every format."""
    _roundtrip(fmt, state, tmp_path / f"m{next(_counter)}{SUFFIX[fmt]}")
