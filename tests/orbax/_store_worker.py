"""Checkpoints in an object store through the orbax format, run by test_object_store.py in a
fresh process whose environment points every client at a local server (_gcs.emulator_env for
fake-gcs-server, _s3.emulator_env for moto).

Usage: python _store_worker.py PREFIX  (gs://bucket/x or s3://bucket/x)
"""

from __future__ import annotations

import sys
from typing import Any

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import jaxstruct.core as js  # noqa: E402
import jaxstruct.io as jio  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from jaxstruct.registry import SerializationError  # noqa: E402


class Model(js.Struct):
    w: Any
    b: Any
    tag: str = js.field(static=True, default="m")


def _model() -> Model:
    mesh = jax.make_mesh((8,), ("x",))
    w = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8)
    return Model(w=jax.device_put(w, NamedSharding(mesh, P("x"))), b=np.arange(3, dtype=np.int16))


def _same(a: Any, b: Any) -> None:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def main(prefix: str) -> None:
    model = _model()
    # A sharded export; loads as stored, into a resharded target, with mesh= and select=.
    path = jio.export(model, f"{prefix}/ck", format="orbax")
    assert path == f"{prefix}/ck", path
    back = jio.load(path, load_cls=Model)
    assert isinstance(back, Model) and back.tag == "m"
    _same(back.w, model.w)
    _same(back.b, model.b)
    cols = NamedSharding(jax.make_mesh((2, 4), ("a", "c")), P(None, "c"))
    target = Model(w=jax.ShapeDtypeStruct((64, 8), jnp.float32, sharding=cols), b=None)
    resharded = jio.load(path, target=target, load_cls=Model)
    assert resharded.w.sharding == cols
    _same(resharded.w, model.w)
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])
    assert jio.load(path, mesh=mesh, load_cls=Model).w.sharding == NamedSharding(mesh, P("x"))
    _same(jio.load(path, select=lambda m: m.b, load_cls=Model), model.b)
    # In the background.
    handle = jio.export(model, f"{prefix}/async", format="orbax", blocking=False)
    handle.wait()
    _same(jio.load(f"{prefix}/async", load_cls=Model).w, model.w)
    # An existing checkpoint is left alone.
    try:
        jio.export({"w": np.zeros(2)}, f"{prefix}/ck", format="orbax")
    except SerializationError:
        pass
    else:
        raise AssertionError("an existing checkpoint was written over")
    _same(jio.load(f"{prefix}/ck", load_cls=Model).b, model.b)
    # A save that stopped before orbax wrote its commit marker (last) is never loaded.
    from etils import epath

    jio.export({"w": np.ones(2)}, f"{prefix}/partial", format="orbax")
    epath.Path(f"{prefix}/partial/commit_success.txt").unlink()
    try:
        jio.load(f"{prefix}/partial")
    except SerializationError as err:
        assert "never committed" in str(err), err
    else:
        raise AssertionError("a checkpoint without its commit marker was loaded")
    # The built-in formats refuse the URL and name the orbax format.
    for fmt in ("directory", "zip"):
        try:
            jio.export({"w": np.ones(2)}, f"{prefix}/builtin-{fmt}", format=fmt)
        except SerializationError as err:
            assert 'format="orbax"' in str(err), err
        else:
            raise AssertionError(f"{fmt} wrote to a URL")
    manager_in_a_bucket(f"{prefix}/run")
    overwrite_in_a_bucket(f"{prefix}/ow")
    print("OK", flush=True)


def manager_in_a_bucket(run: str) -> None:
    """Listing, metrics, keep and best-by-metric, async saves, pruning, killed saves."""
    from etils import epath

    manager = jio.CheckpointManager(run, format="orbax", keep=2, best_metric="loss")
    assert manager.all_steps() == [] and manager.latest_step() is None
    for step, loss in [(1, 0.9), (2, 0.5), (3, 0.7), (4, 0.8)]:
        manager.save(step, {"w": np.full(3, step, np.float32)}, metrics={"loss": loss})
    manager.wait()
    assert manager.all_steps() == [2, 3, 4], manager.all_steps()  # the 2 best, the newest
    assert manager.metrics(2) == {"loss": 0.5} and manager.metrics(1) is None
    assert not epath.Path(f"{run}/1").exists()  # pruned: every object gone
    assert manager.best_step() == 2
    _same(manager.restore()["w"], np.full(3, 4, np.float32))
    mesh = jax.make_mesh((8,), ("x",))
    assert manager.restore(2, mesh=mesh)["w"].sharding == NamedSharding(mesh, P())
    try:
        manager.save(4, {"w": np.zeros(1)})
    except FileExistsError:
        pass
    else:
        raise AssertionError("step 4 saved twice")
    # A save killed before orbax's commit marker: never listed, swept by the next save.
    jio.export({"w": np.zeros(1)}, f"{run}/5", format="orbax")
    epath.Path(f"{run}/5/commit_success.txt").unlink()
    assert manager.all_steps() == [2, 3, 4]
    manager.save(6, {"w": np.full(3, 6, np.float32)}, metrics={"loss": 0.1})
    manager.wait()
    assert not epath.Path(f"{run}/5").exists()
    assert manager.all_steps() == [2, 6], manager.all_steps()  # 6 best and newest, then 2
    assert not epath.Path(f"{run}/.metrics/3.json").exists()
    again = jio.CheckpointManager(run, format="orbax")  # a new run sees the same steps
    assert again.latest_step() == 6 and again.metrics(6) == {"loss": 0.1}


def overwrite_in_a_bucket(url: str) -> None:
    """overwrite=True: at every instant of the swap, loading the URL gives the old or the new
    checkpoint; a replacement stopped midway is loadable and finished by the next one."""
    from etils import epath
    from jaxstruct.orbax import _bucket

    def value(at: str = url) -> float:
        return float(jio.load(at)["w"][0])

    jio.export({"w": np.full(4, 1.0)}, url, format="orbax")
    seen: list[float] = []
    gpath = type(epath.Path(url))  # orbax's path type for this store
    copy, delete = gpath.copy, _bucket.OrbaxRemote.delete_checkpoint

    def copy_and_look(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(value())
        return copy(self, *args, **kwargs)

    def delete_and_look(self: Any, at: str) -> None:
        seen.append(value())
        delete(self, at)
        seen.append(value())

    gpath.copy = copy_and_look  # type: ignore[method-assign]
    _bucket.OrbaxRemote.delete_checkpoint = delete_and_look  # type: ignore[method-assign]
    try:
        jio.export({"w": np.full(4, 2.0)}, url, format="orbax", overwrite=True)
    finally:
        gpath.copy = copy  # type: ignore[method-assign]
        _bucket.OrbaxRemote.delete_checkpoint = delete  # type: ignore[method-assign]
    assert len(seen) > 10 and set(seen) == {1.0, 2.0}, seen  # old, then new: never neither
    assert seen == sorted(seen), seen
    assert value() == 2.0 and not epath.Path(url + _bucket.STAGED).exists()
    # In the background, and over a URL holding nothing yet.
    jio.export({"w": np.full(4, 3.0)}, url, format="orbax", overwrite=True, blocking=False).wait()
    assert value() == 3.0
    jio.export({"w": np.full(4, 4.0)}, f"{url}-new", format="orbax", overwrite=True)
    assert value(f"{url}-new") == 4.0
    # Stopped after the old one was deleted: the staged one loads, the next overwrite ends it.
    jio.export({"w": np.full(4, 5.0)}, url + _bucket.STAGED, format="orbax")
    assert value() == 3.0  # staged but not swapped in: the old one still counts
    _bucket.OrbaxRemote("jaxstruct/metadata").delete_checkpoint(url)
    assert value() == 5.0
    jio.export({"w": np.full(4, 6.0)}, url, format="orbax", overwrite=True)
    assert value() == 6.0 and not epath.Path(url + _bucket.STAGED).exists()
    # Only a committed jaxstruct checkpoint is replaced.
    epath.Path(f"{url}-other/notes.txt").write_text("mine")
    try:
        jio.export({"w": np.ones(2)}, f"{url}-other", format="orbax", overwrite=True)
    except SerializationError as err:
        assert "only replaces checkpoints" in str(err), err
    else:
        raise AssertionError("overwrite=True replaced something that is not a checkpoint")
    assert epath.Path(f"{url}-other/notes.txt").read_text() == "mine"


if __name__ == "__main__":
    main(sys.argv[1])
