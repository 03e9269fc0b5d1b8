"""jaxstruct-safetensors holds its host copies within jaxstruct's one host budget.

Arrays on accelerators are simulated with CPU arrays sent down the copying path
(``_host.FORCE_STREAMING``, and ``_write._in_place`` seeing no host buffer).
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import _budget, _host
from jaxstruct.safetensors import _write

BUDGET = 2 << 20


class _Copies:
    """The host bytes of device copies alive, at most."""

    def __init__(self) -> None:
        self.alive = self.peak = self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, data: Any, local: Any) -> Any:
        out = _host._fresh(data, local)
        nbytes = out.size * out.dtype.itemsize
        with self.lock:
            self.calls += 1
            self.alive += nbytes
            self.peak = max(self.peak, self.alive)
        weakref.finalize(out, self._gone, nbytes)
        return out

    def _gone(self, nbytes: int) -> None:
        with self.lock:
            self.alive -= nbytes


def _state(seed: int, rows: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    mesh = jax.make_mesh((8,), ("a",))
    return {
        "cols": jax.device_put(
            rng.standard_normal((rows, 256)).astype(np.float32), NamedSharding(mesh, P(None, "a"))
        ),
        "rows": jax.device_put(
            rng.integers(0, 9, (rows, 512), np.int16), NamedSharding(mesh, P("a"))
        ),
    }


@pytest.mark.parametrize("rows", [256, 1024], ids=["library writer", "tensor by tensor"])
def test_exports_of_device_arrays_in_threads_hold_at_most_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """Two safetensors exports and a zip export of device arrays at once: the copies the
    library's writer needs are reserved from the budget (512 KiB each, beside each other);
    past the budget, each tensor is streamed a piece at a time. The copies alive and the
    bytes held never pass the budget; the files load exactly."""
    monkeypatch.setattr(_host, "FORCE_STREAMING", True)
    monkeypatch.setattr(_write, "_in_place", lambda arr: None)  # an accelerator's arrays
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, str(BUDGET))
    held: list[int] = []
    lock = threading.Lock()

    def watch(n: int) -> None:
        with lock:
            held.append(n)

    monkeypatch.setattr(_budget, "WATCH", watch)
    copies = _Copies()
    monkeypatch.setattr(_host, "copy_start", copies)
    library = []
    real = _write._with_library
    monkeypatch.setattr(_write, "_with_library", lambda *a: library.append(1) or real(*a))
    states = [_state(i, rows) for i in range(3)]
    paths = [tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.zip"]
    errors: list[BaseException] = []

    def run(state: Any, path: Path) -> None:
        try:
            jio.export(state, path)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=pair) for pair in zip(states, paths, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(library) == (2 if rows == 256 else 0)  # 1 MiB of copies each, or 4 MiB
    assert copies.calls and copies.peak <= BUDGET, copies.peak
    assert max(held) <= BUDGET, max(held)
    assert held[-1] == 0
    for state, path in zip(states, paths, strict=True):
        back = jio.load(path, target=state)
        for key, arr in state.items():
            assert np.asarray(back[key]).tobytes() == np.asarray(arr).tobytes()
