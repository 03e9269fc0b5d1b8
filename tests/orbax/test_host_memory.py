"""format="orbax" holds a bounded share of the model in host memory on save and restore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.orbax import _format, _read


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


def test_a_blocking_save_copies_arrays_to_the_host_within_a_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save of arrays on devices hands orbax a device-to-host budget (arrays larger than
    it are copied alone), and the checkpoint restores exactly."""
    monkeypatch.setattr(_format, "_BUDGET_ON_CPU", True)
    monkeypatch.setattr(_format, "HOST_BUDGET", 64 << 10)  # smaller than most arrays
    seen: list[dict[str, Any]] = []
    real = ocp.PyTreeCheckpointHandler.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(kwargs)
        real(self, *args, **kwargs)

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "__init__", spy)
    model = _model()
    path = jio.export(model, tmp_path / "ck", format="orbax")
    (kwargs,) = [k for k in seen if "save_device_host_concurrent_gb" in k]
    assert kwargs["save_device_host_concurrent_gb"] * 1e9 == 64 << 10
    back = jio.load(
        path,
        target=jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), model
        ),
    )
    for key, arr in model.items():
        np.testing.assert_array_equal(np.asarray(back[key]), np.asarray(arr))


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
