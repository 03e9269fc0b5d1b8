"""Restore without a template: ``load(path, mesh=mesh)`` puts arrays back as they were sharded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.registry import SerializationError

from ._reseal import reseal


class Model(js.Struct):
    w: Any
    b: Any
    scale: Any
    host: Any


def _mesh(shape: tuple[int, ...], names: tuple[str, ...], devices: int = 8) -> jax.sharding.Mesh:
    return jax.sharding.Mesh(np.array(jax.devices()[:devices]).reshape(shape), names)


def _model() -> Model:
    mesh = _mesh((4, 2), ("data", "model"))
    w = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
    b = jnp.arange(8, dtype=jnp.int32)
    return Model(
        w=jax.device_put(w, NamedSharding(mesh, P("data", "model"))),
        b=jax.device_put(b, NamedSharding(mesh, P(("data", "model")))),
        scale=jnp.float32(2.0),  # one device
        host=np.arange(3, dtype=np.int64),
    )


def _saved(tmp_path: Path) -> tuple[Model, Path]:
    model = _model()
    return model, jio.export(model, tmp_path / "ck", format="orbax")


def test_load_with_mesh_restores_each_partition_spec(tmp_path: Path) -> None:
    """Every array comes back with the spec it was saved with, on the given mesh."""
    model, path = _saved(tmp_path)
    mesh = _mesh((4, 2), ("data", "model"))
    out = jio.load(path, mesh=mesh)
    assert isinstance(out, Model)
    assert out.w.sharding == NamedSharding(mesh, P("data", "model"))
    assert out.b.sharding == NamedSharding(mesh, P(("data", "model")))
    # Unsharded arrays (one device, or NumPy) are replicated on the mesh.
    assert out.scale.sharding == NamedSharding(mesh, P())
    assert out.host.sharding == NamedSharding(mesh, P())
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(model), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_load_with_another_topology_matches_axes_by_name(tmp_path: Path) -> None:
    """Other sizes and order of the same axes: the spec follows the names."""
    model, path = _saved(tmp_path)
    mesh = _mesh((2, 2), ("model", "data"), devices=4)
    out = jio.load(path, mesh=mesh)
    assert out.w.sharding == NamedSharding(mesh, P("data", "model"))
    assert len(out.w.addressable_shards) == 4
    np.testing.assert_array_equal(np.asarray(out.w), np.asarray(model.w))


def test_an_axis_the_mesh_lacks_is_replicated_or_refused(tmp_path: Path) -> None:
    model, path = _saved(tmp_path)
    mesh = _mesh((8,), ("data",))
    out = jio.load(path, mesh=mesh)
    assert out.w.sharding == NamedSharding(mesh, P("data", None))
    assert out.b.sharding == NamedSharding(mesh, P("data"))
    np.testing.assert_array_equal(np.asarray(out.b), np.asarray(model.b))
    with pytest.raises(SerializationError, match=r"'model'.*strict_mesh=False"):
        jio.load(path, mesh=mesh, strict_mesh=True)


def test_mesh_works_with_select_and_the_manager(tmp_path: Path) -> None:
    model, _ = _saved(tmp_path)
    mesh = _mesh((4, 2), ("data", "model"))
    w = jio.load(tmp_path / "ck", mesh=mesh, select=lambda m: m.w)
    assert w.sharding == NamedSharding(mesh, P("data", "model"))
    manager = jio.CheckpointManager(tmp_path / "run", format="orbax", blocking=True)
    manager.save(3, model)
    out = manager.restore(mesh=mesh)
    assert out.b.sharding == NamedSharding(mesh, P(("data", "model")))
    np.testing.assert_array_equal(np.asarray(out.w), np.asarray(model.w))


def test_target_placements_win_over_mesh(tmp_path: Path) -> None:
    """Leaves the target places keep that placement; the others follow the record."""
    _, path = _saved(tmp_path)
    mesh = _mesh((4, 2), ("data", "model"))
    other = NamedSharding(mesh, P(None, "data"))
    abstract = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=other)
    target = Model(w=abstract, b=None, scale=None, host=None)
    out = jio.load(path, mesh=mesh, target=target)
    assert out.w.sharding == other
    assert out.b.sharding == NamedSharding(mesh, P(("data", "model")))


def test_without_mesh_a_single_device_load_is_unchanged(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    out = jio.load(path)
    assert isinstance(out.w, jax.Array) and len(out.w.sharding.device_set) == 1
    assert isinstance(out.host, np.ndarray)


def test_checkpoints_without_the_record_refuse_mesh(tmp_path: Path) -> None:
    """An orbax checkpoint from before the record, and the built-in formats: a clear error."""
    model, path = _saved(tmp_path)
    storage = path / "jaxstruct_storage" / "metadata"
    document = json.loads(storage.read_text())
    del document["shardings"]
    storage.write_text(json.dumps(document))
    reseal(path)
    mesh = _mesh((8,), ("data",))
    with pytest.raises(SerializationError, match=r"does not record how its arrays were sharded"):
        jio.load(path, mesh=mesh)
    np.testing.assert_array_equal(jio.load(path).w, np.asarray(model.w))  # as before
    plain = jio.export({"w": np.ones(3)}, tmp_path / "plain")
    with pytest.raises(SerializationError, match=r"target="):
        jio.load(plain, mesh=mesh)


def test_a_malformed_record_is_refused(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    storage = path / "jaxstruct_storage" / "metadata"
    document = json.loads(storage.read_text())
    document["shardings"]["a0"]["spec"] = ["nowhere"]
    storage.write_text(json.dumps(document))
    reseal(path)
    with pytest.raises(SerializationError, match=r"malformed sharding record for array"):
        jio.load(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"version": 1, "version": 2}', "duplicate JSON key 'version'"),
        ("{", "is not valid JSON"),
    ],
)
def test_a_malformed_storage_item_is_our_error(tmp_path: Path, text: str, message: str) -> None:
    """The storage item is read as strictly as the manifest: each breakage is a
    SerializationError naming the item, never Python's RecursionError."""
    _, path = _saved(tmp_path)
    (path / "jaxstruct_storage" / "metadata").write_text(text)
    with pytest.raises(SerializationError, match=rf"storage item.*{message}"):
        jio.load(path)


def test_mesh_must_be_a_mesh(tmp_path: Path) -> None:
    _, path = _saved(tmp_path)
    with pytest.raises(TypeError, match=r"jax\.sharding\.Mesh"):
        jio.load(path, mesh="data")
