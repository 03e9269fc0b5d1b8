"""Two processes on 127.0.0.1 (jax.distributed, 4 CPU devices each) saving and restoring."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ._server import free_port
from ._stores import STORES, serve

# Both tests start two jax.distributed processes: never run them side by side.
pytestmark = pytest.mark.xdist_group("multiprocess")

WORKER = Path(__file__).with_name("_worker.py")
TIMEOUT = 180


def _start(
    task: str, directory: Path | str, env_extra: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    port = str(free_port())
    # Our waits end (with an error naming the missing process) before the worker's own
    # stall deadline, so a failure shows where each process was.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", jio.SYNC_TIMEOUT_ENV: "75", **(env_extra or {})}
    env.pop("XLA_FLAGS", None)
    procs = []
    for i in range(2):
        # Output goes to files, not pipes: a worker blocked writing to a full
        # pipe that nobody reads (we wait on its peer first) stalls that peer at
        # the next barrier, a deadlock seen as a 180 s hang under load.
        logs = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))  # noqa: SIM115  # closed by _finish
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), task, port, str(i), str(directory)],
            stdout=logs[0],
            stderr=logs[1],
            text=True,
            env=env,
        )
        proc.logs = logs  # type: ignore[attr-defined]
        procs.append(proc)
    return procs


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    """Wait for every process (killing all on timeout); return (code, stdout, stderr) each."""
    deadline = time.monotonic() + TIMEOUT
    try:
        for proc in procs:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=TIMEOUT)
    results = []
    for proc in procs:
        out, err = proc.logs  # type: ignore[attr-defined]
        with out, err:
            out.seek(0)
            err.seek(0)
            results.append((proc.returncode, out.read(), err.read()))
    return results


def _all_ok(results: list[tuple[int, str, str]]) -> list[str]:
    """Assert that every process printed its OK and exited 0, showing every process's stderr
    (the one that failed first is often not the one whose peer timed out)."""
    failed = {
        f"process {i} (exit {code})": err[-2500:]
        for i, (code, out, err) in enumerate(results)
        if code != 0 or f"OK {i}" not in out.splitlines()
    }
    assert not failed, "\n\n".join(f"== {who}\n{err}" for who, err in failed.items())
    return [out for _, out, _ in results]


def _restore_with_eight_devices(saved: Path) -> None:
    sharding = NamedSharding(jax.make_mesh((8,), ("x",)), P(None, "x"))
    target = {
        "a": jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=sharding),
        "r": None,
        "step": None,
    }
    back = jio.load(saved, target=target)
    assert back["a"].sharding == sharding
    expected = np.arange(128, dtype=np.float32).reshape(16, 8)
    np.testing.assert_array_equal(np.asarray(back["a"]), expected)
    np.testing.assert_array_equal(np.asarray(back["r"]), expected)


def _restore_with_one_device(saved: Path) -> None:
    code = (
        "import sys, numpy as np, jax, jaxstruct.io as jio\n"
        "assert jax.device_count() == 1\n"
        "back = jio.load(sys.argv[1])\n"
        "np.testing.assert_array_equal(np.asarray(back['a']), np.arange(128.).reshape(16, 8))\n"
        "print(back['a'].sharding.device_set == {jax.devices()[0]})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(saved)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "True"


def test_two_process_checkpoint_restores_anywhere(tmp_path: Path) -> None:
    """Saved by 2 processes, it restores in 2 (two shardings), in 1 with 8 devices and with 1."""
    # The two processes also restore into two shardings and check the built-in
    # formats' rules (replicated data written once, cross-process arrays refused).
    _all_ok(_finish(_start("save_restore", tmp_path)))
    saved = tmp_path / "ck"
    assert (saved / "_CHECKPOINT_METADATA").is_file()
    _restore_with_eight_devices(saved)
    _restore_with_one_device(saved)


def test_two_process_restore_matrix(tmp_path: Path) -> None:
    """Saved and restored by 2 processes: 0-d to 2-d, every dtype, keys, weak scalars, exact."""
    _all_ok(_finish(_start("restore_matrix", tmp_path)))


def test_kill_one_process_mid_save_keeps_the_previous_step(tmp_path: Path) -> None:
    """SIGKILL of one process during a 2-process save leaves the previous step loadable."""
    procs = _start("kill_mid_save", tmp_path)
    try:
        assert procs[1].wait(TIMEOUT) == -signal.SIGKILL
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        _finish(procs)
    manager = jio.CheckpointManager(tmp_path, format="orbax")
    assert manager.all_steps() == [1]
    back = manager.restore()
    np.testing.assert_array_equal(np.asarray(back["a"]), np.arange(128.0).reshape(16, 8))


def test_a_process_that_never_comes_ends_the_wait(tmp_path: Path) -> None:
    """Every wait of a 2-process save or restore ends within JAXSTRUCT_SYNC_TIMEOUT_S, and its
    error names the phase, the path and the missing process; both processes then exit."""
    _all_ok(_finish(_start("straggler", tmp_path, {jio.SYNC_TIMEOUT_ENV: "3"})))


def test_preempted_two_process_run_saves_and_resumes_bit_exactly(tmp_path: Path) -> None:
    """SIGTERM to one process of a 2-process loop: both agree on a step (JAX's preemption
    sync point), save it, exit 0; a new run restores that step on 8 devices bit-exactly."""
    procs = _start("preempt", tmp_path)
    deadline = time.monotonic() + TIMEOUT
    while not (tmp_path / "running").exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    steps = set()
    for out in _all_ok(_finish(procs)):
        steps.add(next(line for line in out.splitlines() if line.startswith("SAVED ")))
    assert len(steps) == 1  # the same step in both processes
    saved = int(steps.pop().split()[1])
    manager = jio.CheckpointManager(tmp_path, format="orbax")
    assert manager.latest_step() == saved and saved % 50 != 0
    mesh = jax.make_mesh((8,), ("x",))
    back = manager.restore(mesh=mesh)
    assert back["step"] == saved
    assert back["w"].sharding.is_equivalent_to(NamedSharding(mesh, P("x")), 2)
    step_fn = jax.jit(lambda w: w * 0.5 + 1.0)
    expected = jnp.arange(128, dtype=jnp.float32).reshape(16, 8)
    for _ in range(saved):
        expected = step_fn(expected)
    assert np.asarray(back["w"]).tobytes() == np.asarray(expected).tobytes()


@pytest.mark.parametrize("kind", STORES)
def test_two_processes_save_to_an_object_store_and_restore(kind: str) -> None:
    """The 2-process save, overwrite and restore, in a bucket of a local server on 127.0.0.1."""
    with serve(kind) as store:
        _all_ok(_finish(_start("store", f"{store.root}/two", store.env)))
        stored = store.objects("two/ck/")
        assert "two/ck/commit_success.txt" in stored, stored
        assert any(name.startswith("two/ck/arrays/ocdbt.process_1/") for name in stored), stored
        assert not store.objects("two/ck.jaxstruct-replacing"), "the staged copy was left"
