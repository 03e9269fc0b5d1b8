"""format="orbax" holds a bounded share of the model in host memory on save and restore."""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import _budget, _host
from jaxstruct.orbax import _format, _read
from orbax.checkpoint._src.serialization import replica_slices


def _model() -> dict[str, Any]:
    mesh = jax.make_mesh((8,), ("x",))
    rng = np.random.default_rng(0)
    return {
        f"w{i}": jax.device_put(
            rng.standard_normal((256, 64 * (i + 1))).astype(np.float32),
            NamedSharding(mesh, P("x")),
        )
        for i in range(4)
    }


def test_cpu_arrays_keep_orbax_defaults() -> None:
    """Arrays already in host memory (CPU devices, NumPy) get no budget: nothing to copy."""
    assert _format._host_budget(_model()) is None
    assert _format._host_budget({"w": np.ones(3)}) is None


def test_a_blocking_save_copies_arrays_to_the_host_in_batches_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blocking save of arrays on devices has orbax copy them to the host in batches
    within JAXSTRUCT_HOST_BUDGET (an array larger than it alone), each written before the
    next is copied, not all at once; the checkpoint restores exactly."""
    monkeypatch.setattr(_format, "_BUDGET_ON_CPU", True)
    budget = 256 << 10
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, str(budget))
    batches: list[list[int]] = []
    real = replica_slices.transfer_arrays_to_host

    def spy(arrays: Any, *args: Any, **kwargs: Any) -> Any:
        batches.append([a.nbytes for a in arrays])
        return real(arrays, *args, **kwargs)

    monkeypatch.setattr(replica_slices, "transfer_arrays_to_host", spy)
    model = _model()  # arrays of 64, 128, 192 and 256 KiB
    path = jio.export(model, tmp_path / "ck", format="orbax")
    assert sorted(n for batch in batches for n in batch) == sorted(a.nbytes for a in model.values())
    assert len(batches) > 1
    assert all(sum(batch) <= budget or len(batch) == 1 for batch in batches), batches
    back = jio.load(
        path,
        target=jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), model
        ),
    )
    for key, arr in model.items():
        np.testing.assert_array_equal(np.asarray(back[key]), np.asarray(arr))


def test_a_blocking_save_reserves_its_batches_from_the_process_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While orbax saves, its batches' bytes are held in the process's host budget: an
    export in another thread at the same time keeps the two within it together, and the
    copies the checksums are computed from (on accelerators) stay within it too."""
    monkeypatch.setattr(_format, "_BUDGET_ON_CPU", True)
    monkeypatch.setattr(_host, "FORCE_STREAMING", True)
    budget = 512 << 10
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, str(budget))
    held: list[int] = []
    monkeypatch.setattr(_budget, "WATCH", held.append)
    alive = [0, 0]  # bytes of device copies alive, and their peak
    lock = threading.Lock()

    def copy(data: Any, local: Any) -> Any:
        out = _host._fresh(data, local)
        nbytes = out.size * out.dtype.itemsize
        with lock:
            alive[0] += nbytes
            alive[1] = max(alive)
        weakref.finalize(out, gone, nbytes)
        return out

    def gone(nbytes: int) -> None:
        with lock:
            alive[0] -= nbytes

    monkeypatch.setattr(_host, "copy_start", copy)
    seen: list[int] = []
    real = ocp.PyTreeCheckpointHandler.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        if "save_device_host_concurrent_gb" in kwargs:
            seen.append(round(kwargs["save_device_host_concurrent_gb"] * 1e9))
            seen.append(max(held, default=0))  # the reservation is not taken yet
        real(self, *args, **kwargs)

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "__init__", spy)
    model = _model()
    errors: list[BaseException] = []

    def zip_export() -> None:
        try:
            jio.export(model, tmp_path / "other.zip", compression="deflate")
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    thread = threading.Thread(target=zip_export)
    thread.start()
    jio.export(model, tmp_path / "ck", format="orbax")
    thread.join()
    assert errors == []
    assert seen and seen[0] == budget  # the model's 640 KiB are more than the budget
    assert max(held) <= budget, max(held)
    assert held[-1] == 0
    assert budget in held  # the save held all of it at some point
    assert 0 < alive[1] <= budget, alive


def test_a_restore_hands_each_shard_to_its_devices_once_it_is_filled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shards go to their devices (and their host buffers go) while later blocks are still
    being read, not all at the end of the restore."""
    model = _model()
    path = jio.export(model, tmp_path / "ck", format="orbax")
    monkeypatch.setattr(_read, "BLOCK_BYTES", 16 << 10)  # many blocks
    still_filling: list[int] = []
    plans: list[Any] = []
    real_init, real_place = _read._Plan.__init__, _read._Plan.place

    def init(self: Any, job: Any) -> None:
        real_init(self, job)
        plans.append(self)

    def place(self: Any, box: Any) -> None:
        still_filling.append(sum(len(p.buffers) for p in plans) - 1)
        real_place(self, box)

    monkeypatch.setattr(_read._Plan, "__init__", init)
    monkeypatch.setattr(_read._Plan, "place", place)
    resharded = NamedSharding(jax.make_mesh((2, 4), ("a", "b")), P("b", "a"))
    target = {
        k: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=resharded) for k, a in model.items()
    }
    back = jio.load(path, target=target)
    for key, arr in model.items():
        np.testing.assert_array_equal(np.asarray(back[key]), np.asarray(arr))
    assert len(still_filling) == 4 * 8
    assert still_filling[0] > 8  # the first shard left while most buffers were still filling
