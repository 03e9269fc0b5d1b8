"""One process of a 2-process run on 127.0.0.1 (started by test_multiprocess.py).

Usage: python _worker.py TASK PORT PROCESS_ID DIRECTORY
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time

import jax

TIMEOUT_S = 60
# A worker never outlives its test: stalled past this, it prints every thread's
# stack (for the test to show) and exits.
faulthandler.dump_traceback_later(2 * TIMEOUT_S, exit=True)


def _init(port: str, process_id: int) -> None:
    try:
        jax.config.update("jax_num_cpu_devices", 4)
    except AttributeError:  # JAX before 0.5: the XLA flag, read when the backend starts
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=TIMEOUT_S,
    )


def _expected(shape: tuple[int, int]) -> object:
    import numpy as np

    return np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)


def _global(shape: tuple[int, int], spec: object) -> jax.Array:
    from jax.sharding import NamedSharding

    mesh = jax.make_mesh((8,), ("x",))
    full = _expected(shape)
    return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda i: full[i])  # type: ignore[index]


def _check_shards(arr: jax.Array, shape: tuple[int, int]) -> None:
    import numpy as np

    full = _expected(shape)
    for shard in arr.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), full[shard.index])  # type: ignore[index]


def task_save_restore(directory: str) -> None:
    """Save a cross-process array, restore it into two shardings; built-in format rules."""
    import jax.experimental.multihost_utils
    import jaxstruct.io as jio
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from jaxstruct.registry import SerializationError

    shape = (16, 8)
    a = _global(shape, P("x"))
    assert not a.is_fully_addressable
    replicated = _global(shape, P())
    jio.export({"a": a, "r": replicated, "step": 3}, os.path.join(directory, "ck"), format="orbax")
    mesh = jax.make_mesh((8,), ("x",))
    for spec in (P("x"), P(None, "x")):
        target = {
            "a": jax.ShapeDtypeStruct(shape, a.dtype, sharding=NamedSharding(mesh, spec)),
            "r": None,
            "step": None,
        }
        back = jio.load(os.path.join(directory, "ck"), target=target)
        assert back["a"].sharding == NamedSharding(mesh, spec) and back["step"] == 3
        _check_shards(back["a"], shape)
    # overwrite=True: the processes write a temporary sibling together, process 0
    # swaps it in; nothing else is left in the directory.
    again = os.path.join(directory, "again")
    jio.export({"a": a}, again, format="orbax")
    # Process 1 is slow to finish its part: process 0 swaps the new checkpoint in meanwhile,
    # and process 1 must not look for the temporary sibling that then no longer exists.
    from jaxstruct.io import _publish

    if jax.process_index() == 1:
        _publish.STEP_HOOK = lambda name: time.sleep(1.5) if name == "temp-synced" else None
    jio.export({"a": a * 2, "step": 4}, again, format="orbax", overwrite=True)
    _publish.STEP_HOOK = None
    back = jio.load(
        again, target={"a": jax.ShapeDtypeStruct(shape, a.dtype, sharding=a.sharding), "step": None}
    )
    assert back["step"] == 4
    for shard in back["a"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), 2 * _expected(shape)[shard.index])  # type: ignore[index,operator]
    # (Both look before either goes on: process 0's next export makes a temporary file.)
    leftovers = [name for name in os.listdir(directory) if name.startswith(".")]
    jax.experimental.multihost_utils.sync_global_devices("listed")
    assert not leftovers, leftovers
    # Built-in formats: replicated data is written once, by process 0.
    jio.export({"r": replicated}, os.path.join(directory, "builtin.zip"))
    back = jio.load(os.path.join(directory, "builtin.zip"))
    _check_shards(back["r"], shape)
    # Process 0 may publish before process 1 even starts its call: process 1 must
    # not then take the new file for an old one in its way.
    if jax.process_index() == 1:
        time.sleep(2)
    jio.export({"r": replicated}, os.path.join(directory, "late.zip"))
    # A path that exists is refused in every process alike, and none waits forever.
    try:
        jio.export({"r": replicated}, os.path.join(directory, "late.zip"))
    except FileExistsError as err:
        assert "overwrite=True" in str(err), err
    else:
        raise AssertionError("an existing checkpoint was not refused")
    try:
        jio.export({"a": a}, os.path.join(directory, "refused.zip"))
    except SerializationError as err:
        assert 'format="orbax"' in str(err), err
    else:
        raise AssertionError("the zip format accepted an array no process holds")
    assert not os.path.exists(os.path.join(directory, "refused.zip"))
    # An array on process 1's devices alone: both processes refuse it alike.
    from jax.sharding import Mesh

    theirs = Mesh(np.array([d for d in jax.devices() if d.process_index == 1]), ("y",))
    only_one = jax.make_array_from_callback(
        shape,
        NamedSharding(theirs, P()),
        lambda i: _expected(shape)[i],  # type: ignore[index]
        dtype=np.float32,
    )
    try:
        jio.export({"b": only_one}, os.path.join(directory, "elsewhere.zip"))
    except SerializationError as err:
        assert "process 0" in str(err) and 'format="orbax"' in str(err), err
    else:
        raise AssertionError("the zip format accepted an array process 0 does not hold")


def _matrix_leaves() -> dict[str, object]:
    """Host values of the 2-process restore matrix: 0-d to 2-d, dtypes, keys, weak scalars."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    return {
        "step": np.array(20, np.int32),
        "f32": np.array(-2.5, np.float32),
        "bf16": np.array(1.5, jnp.bfloat16),
        "i8": np.array(-7, np.int8),
        "u32": np.array(4_000_000_000, np.uint32),
        "flag": np.array(True),
        "c64": np.array(1 - 2j, np.complex64),
        "vec": rng.standard_normal(16).astype(np.float32),
        "odd": rng.standard_normal(7).astype(np.float16),
        "mat": rng.standard_normal((8, 4)).astype(jnp.bfloat16),
        "imat": rng.integers(-100, 100, (6, 3)).astype(np.int8),
    }


def _put(host: object, sharding: object) -> jax.Array:
    import numpy as np

    arr = np.asarray(host)
    return jax.make_array_from_callback(arr.shape, sharding, lambda i: arr[i])  # type: ignore[arg-type]


def _matrix_spec(shape: tuple[int, ...], axes: tuple[str, ...], sizes: tuple[int, ...]) -> object:
    from jax.sharding import PartitionSpec as P

    spec: list[str | None] = []
    free = list(zip(axes, sizes, strict=True))
    for n in shape:
        pick = next(((a, k) for a, k in free if n % k == 0), None)
        spec.append(pick[0] if pick else None)
        if pick:
            free.remove(pick)
    return P(*spec)


def _same_bits(got: jax.Array, host: object, weak: bool) -> None:
    import numpy as np

    expected = np.asarray(host)
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got, expected)
    assert got.weak_type == weak, (got, weak)
    for shard in got.addressable_shards:
        assert np.asarray(shard.data).tobytes() == expected[shard.index].tobytes(), shard.index


def task_restore_matrix(directory: str) -> None:
    """Across 2 processes: every leaf kind, replicated and sharded, into every target kind."""
    import jax.numpy as jnp
    import jaxstruct.io as jio
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    meshes = {"1d": jax.make_mesh((8,), ("x",)), "2d": jax.make_mesh((2, 4), ("a", "b"))}
    other = jax.make_mesh((4, 2), ("p", "q"))
    hosts = _matrix_leaves()
    key_data = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(3), 8)))
    for name, mesh in meshes.items():
        axes, sizes = mesh.axis_names, tuple(mesh.shape.values())
        state: dict[str, object] = {}
        for leaf, host in hosts.items():
            shape = np.shape(host)
            state[leaf + "_rep"] = _put(host, NamedSharding(mesh, P()))
            state[leaf + "_shd"] = _put(host, NamedSharding(mesh, _matrix_spec(shape, axes, sizes)))
        key_axis = axes[-1] if name == "1d" else None
        data = _put(key_data, NamedSharding(mesh, P(key_axis, None)))
        state["keys"] = jax.random.wrap_key_data(data)
        one = np.asarray(jax.random.key_data(jax.random.key(9)))
        state["key"] = jax.random.wrap_key_data(_put(one, NamedSharding(mesh, P())))
        make_lr = jax.jit(lambda: jnp.asarray(0.1), out_shardings=NamedSharding(mesh, P()))
        state["lr"] = make_lr()
        assert state["lr"].weak_type
        path = os.path.join(directory, f"matrix_{name}")
        jio.export(state, path, format="orbax")
        abstract = {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)  # type: ignore[attr-defined]
            for k, v in state.items()
        }
        resharded = {
            k: jax.ShapeDtypeStruct(
                v.shape,  # type: ignore[attr-defined]
                v.dtype,  # type: ignore[attr-defined]
                sharding=NamedSharding(other, _matrix_spec(v.shape, ("p", "q"), (4, 2))),  # type: ignore[attr-defined]
            )
            for k, v in state.items()
        }
        for target in (state, abstract, resharded):
            back = jio.load(path, target=target)
            for leaf, host in hosts.items():
                for suffix in ("_rep", "_shd"):
                    got = back[leaf + suffix]
                    _same_bits(got, host, weak=False)
                    assert got.sharding.is_equivalent_to(target[leaf + suffix].sharding, got.ndim)  # type: ignore[attr-defined]
            for k in ("keys", "key"):
                _same_bits(
                    jax.random.key_data(back[k]),
                    key_data if k == "keys" else np.asarray(jax.random.key_data(jax.random.key(9))),
                    weak=False,
                )
            _same_bits(back["lr"], np.float32(0.1), weak=True)


def task_kill_mid_save(directory: str) -> None:
    """Save step 1, then start step 2; process 1 dies by SIGKILL in the middle."""
    import signal

    import jaxstruct.io as jio
    from jax.sharding import PartitionSpec as P

    manager = jio.CheckpointManager(directory, format="orbax")
    manager.save(1, {"a": _global((16, 8), P("x"))})
    manager.wait(TIMEOUT_S)
    big = _global((4096, 1024), P("x"))
    manager.save(2, {"a": big})
    if jax.process_index() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(TIMEOUT_S)  # process 0 is stuck at orbax's barrier; the test kills it


def task_straggler(directory: str) -> None:
    """One process never comes (JAXSTRUCT_SYNC_TIMEOUT_S=3): the other's wait ends, naming it."""
    import jaxstruct.io as jio
    from jax._src import distributed
    from jax.sharding import PartitionSpec as P
    from jaxstruct.registry import SerializationError

    client = distributed.global_state.client
    value = {"a": _global((16, 8), P("x"))}
    saved = os.path.join(directory, "ck")
    jio.export(value, saved, format="orbax")
    start = time.monotonic()
    if jax.process_index() == 0:
        late = os.path.join(directory, "late")
        calls = [
            (lambda: jio.export(value, late, format="orbax"), "export-start", late),
            (lambda: jio.load(saved), "load-start", saved),
        ]
        for call, phase, path in calls:
            try:
                call()
            except SerializationError as err:
                message = str(err)
                assert message.startswith(f"{phase} for {path!r}:"), message
                assert "process(es) [1] did not arrive within 3 s" in message, message
            else:
                raise AssertionError(f"{phase}: no error although process 1 never came")
        assert not os.path.exists(late)
        client.key_value_set("straggler-0", "done")
        client.blocking_key_value_get("straggler-1", TIMEOUT_S * 1000)
    else:
        client.blocking_key_value_get("straggler-0", TIMEOUT_S * 1000)
        start = time.monotonic()
        never = os.path.join(directory, "never.zip")
        try:  # written by process 0 alone, which never comes
            jio.export({"r": [1, 2, 3]}, never)
        except SerializationError as err:
            message = str(err)
            assert message.startswith(f"export-zip for {never!r}:"), message
            assert "process 0 did not finish within 3 s" in message, message
        else:
            raise AssertionError("no error although process 0 never came")
        client.key_value_set("straggler-1", "done")
    assert time.monotonic() - start < 30, time.monotonic() - start


def _train_step(w: object) -> object:
    return w * 0.5 + 1.0  # type: ignore[operator]


def task_preempt(directory: str) -> None:
    """A training loop saving every 50 steps; the test sends SIGTERM to process 1 only."""
    import jaxstruct.io as jio
    from jax.sharding import PartitionSpec as P

    manager = jio.CheckpointManager(directory, format="orbax", save_on_preemption=True)
    step_fn = jax.jit(_train_step)
    w = _global((16, 8), P("x"))
    step = 0
    for step in range(1, 100_000):
        w = step_fn(w)
        preempted = manager.reached_preemption(step)  # every step, before anything else
        if step % 50 == 0 or preempted:
            manager.save(step, {"w": w, "step": step})
        if manager.preempted:
            break
        if step == 3 and jax.process_index() == 0:
            with open(os.path.join(directory, "running"), "w") as mark:
                mark.write("3")
        time.sleep(0.02)
    assert manager.preempted, "the loop ran out without a preemption"
    manager.close()
    print(f"SAVED {step}", flush=True)


def task_store(directory: str) -> None:
    """Save a cross-process array to an object store (gs:// or s3://, a local server), load
    it with mesh= and a target, replace it (overwrite=True); a manager there (every process
    saves, process 0 prunes)."""
    import jax.experimental.multihost_utils
    import jaxstruct.io as jio
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    url = f"{directory}/ck"  # here "directory" is a gs:// or s3:// prefix
    jio.export({"a": _global((16, 8), P("x")), "step": 3}, url, format="orbax")
    mesh = jax.make_mesh((8,), ("x",))
    back = jio.load(url, mesh=mesh)
    assert back["a"].sharding == NamedSharding(mesh, P("x")) and back["step"] == 3
    _check_shards(back["a"], (16, 8))
    cols = NamedSharding(mesh, P(None, "x"))
    target = {"a": jax.ShapeDtypeStruct((16, 8), jax.numpy.float32, sharding=cols), "step": None}
    _check_shards(jio.load(url, target=target)["a"], (16, 8))
    jio.export({"a": _global((16, 8), P("x")), "step": 4}, url, format="orbax", overwrite=True)
    back = jio.load(url, mesh=mesh)
    assert back["step"] == 4
    _check_shards(back["a"], (16, 8))
    # The manager in the bucket: every process saves, process 0 prunes.
    manager = jio.CheckpointManager(f"{directory}/run", format="orbax", keep=1)
    for step in (1, 2):
        manager.save(step, {"a": _global((16, 8), P("x")), "step": step}, metrics={"loss": 1.0})
    manager.wait()
    jax.experimental.multihost_utils.sync_global_devices("pruned")
    assert manager.all_steps() == [2], manager.all_steps()
    back = manager.restore(mesh=mesh)
    assert back["step"] == 2
    _check_shards(back["a"], (16, 8))
    manager.close()


def main() -> None:
    task, port, process_id, directory = sys.argv[1:5]
    _init(port, int(process_id))
    globals()[f"task_{task}"](directory)
    print(f"OK {process_id}", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
