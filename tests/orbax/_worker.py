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
    jio.export({"a": a * 2, "step": 4}, again, format="orbax", overwrite=True)
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


def main() -> None:
    task, port, process_id, directory = sys.argv[1:5]
    _init(port, int(process_id))
    globals()[f"task_{task}"](directory)
    print(f"OK {process_id}", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
