"""Sharded checkpoints: jaxstruct's "orbax" format against orbax-checkpoint used directly.

Every figure is a ratio to orbax timed in the same run (best of ``--repeats``,
the two sides interleaved), plus peak RSS growth sampled every few ms:

* save of a float32 array sharded over 8 CPU devices: ``export(format="orbax")``
  vs ``StandardCheckpointer.save`` (target <= 1.0x), peak RSS growth (<= 0.3 GiB
  at 1 GiB);
* restore into a sharded target: ``load(target=...)`` vs orbax's restore with
  the same abstract target (<= 1.0x), peak RSS growth (<= 1.1x the data);
* the blocking part of ``export(blocking=False)`` vs a blocking export (<= 5%);
* many small arrays: the built-in zip format vs orbax (>= 10x faster).

Run:  uv run --frozen --all-packages python benchmarks/bench_orbax.py [--gib 1] [--small 100000]
(``--quick`` = 0.125 GiB and 5,000 small arrays, for a smoke run.)
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

GiB = 1 << 30
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * _PAGE


class _Peak:
    """Samples RSS in a thread; ``growth`` is the peak minus the RSS at start."""

    def __enter__(self) -> _Peak:
        self.start = _rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self.peak = max(self.peak, _rss())
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


def _timed(fn: Callable[[], Any]) -> tuple[float, int]:
    with _Peak() as peak:
        t0 = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - t0
    return elapsed, peak.growth


def _fresh(root: Path, name: str) -> Path:
    path = root / name
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    return path


def _data(rows: int, cols: int, sharding: NamedSharding) -> jax.Array:
    """Incompressible float32 data, generated on the devices shard by shard."""
    make = jax.jit(
        lambda: jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32),
        out_shardings=sharding,
    )
    return make().block_until_ready()


def bench_sharded(root: Path, gib: float, repeats: int) -> list[tuple[str, str, str, str]]:
    mesh = jax.make_mesh((8,), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    cols = 4096
    rows = max(8, int(gib * GiB) // (4 * cols) // 8 * 8)
    arr = _data(rows, cols, sharding)
    nbytes = arr.size * 4
    checkpointer = ocp.StandardCheckpointer()

    def orbax_save() -> None:
        checkpointer.save(_fresh(root, "orbax"), {"w": arr})
        checkpointer.wait_until_finished()

    def ours_save() -> None:
        jio.export({"w": arr}, _fresh(root, "ours"), format="orbax")

    saves: dict[str, list[tuple[float, int]]] = {"orbax": [], "ours": []}
    for _ in range(repeats):
        saves["orbax"].append(_timed(orbax_save))
        saves["ours"].append(_timed(ours_save))
    t_orbax = min(t for t, _ in saves["orbax"])
    t_ours = min(t for t, _ in saves["ours"])
    mem_save = max(m for _, m in saves["ours"])
    mem_save_orbax = max(m for _, m in saves["orbax"])

    target = jax.ShapeDtypeStruct(arr.shape, arr.dtype, sharding=NamedSharding(mesh, P(None, "x")))
    del arr
    restores: dict[str, list[tuple[float, int]]] = {"orbax": [], "ours": []}

    def orbax_restore() -> None:
        checkpointer.restore(root / "orbax", {"w": target})["w"].block_until_ready()

    def ours_restore() -> None:
        jio.load(root / "ours", target={"w": target})["w"].block_until_ready()

    for _ in range(repeats):
        restores["orbax"].append(_timed(orbax_restore))
        restores["ours"].append(_timed(ours_restore))
    r_orbax = min(t for t, _ in restores["orbax"])
    r_ours = min(t for t, _ in restores["ours"])
    mem_restore = max(m for _, m in restores["ours"])
    mem_restore_orbax = max(m for _, m in restores["orbax"])

    arr = _data(rows, cols, sharding)
    blocking_parts = []
    for _ in range(repeats):
        path = _fresh(root, "async")
        t0 = time.perf_counter()
        handle = jio.export({"w": arr}, path, format="orbax", blocking=False)
        blocking_parts.append(time.perf_counter() - t0)
        handle.wait()
    checkpointer.close()
    size = f"{nbytes / GiB:.3g} GiB"
    return [
        (
            f"save {size} (8 shards)",
            f"{t_orbax:.2f} s",
            f"{t_ours / t_orbax:.2f}x",
            f"<= 1.0x; RSS +{mem_save / GiB:.2f} GiB, orbax +{mem_save_orbax / GiB:.2f} (<= 0.3)",
        ),
        (
            f"restore {size} into a resharded target",
            f"{r_orbax:.2f} s",
            f"{r_ours / r_orbax:.2f}x",
            f"<= 1.0x; RSS +{mem_restore / nbytes:.2f}x data, orbax "
            f"+{mem_restore_orbax / nbytes:.2f}x (<= 1.1)",
        ),
        (
            f"blocking part of an async save, {size}",
            f"{t_ours:.2f} s (blocking save)",
            f"{min(blocking_parts) / t_ours:.1%}",
            "<= 5%",
        ),
    ]


def bench_small(root: Path, count: int, repeats: int) -> tuple[str, str, str, str]:
    tree = {f"p{i}": np.full((4,), i, np.float32) for i in range(count)}
    checkpointer = ocp.StandardCheckpointer()

    def orbax_save() -> None:
        checkpointer.save(_fresh(root, "small-orbax"), tree)
        checkpointer.wait_until_finished()

    t_orbax = min(_timed(orbax_save)[0] for _ in range(max(1, repeats - 1)))
    t_ours = min(
        _timed(lambda: jio.export(tree, _fresh(root, "small.zip")))[0] for _ in range(repeats)
    )
    checkpointer.close()
    return (
        f"save {count:,} small arrays (zip vs orbax)",
        f"{t_orbax:.2f} s",
        f"{t_orbax / t_ours:.1f}x faster",
        ">= 10x",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the sharded array")
    parser.add_argument("--small", type=int, default=100_000, help="number of small arrays")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="0.125 GiB, 5,000 small arrays")
    args = parser.parse_args()
    if args.quick:
        args.gib, args.small, args.repeats = 0.125, 5_000, 2
    root = Path(tempfile.mkdtemp(prefix="bench-orbax-"))
    try:
        rows = bench_sharded(root, args.gib, args.repeats)
        rows.append(bench_small(root, args.small, args.repeats))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"### jaxstruct orbax format vs orbax-checkpoint (load average {load:.1f})\n")
    print("| operation | orbax | jaxstruct / orbax | target |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
