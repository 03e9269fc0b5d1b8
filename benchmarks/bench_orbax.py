"""Sharded checkpoints: jaxstruct's "orbax" format against orbax-checkpoint and the disk.

Every figure is measured as a user would see it: in a fresh Python process
(jax, orbax and jaxstruct imported and the operation warmed up on a tiny
array first, not timed), JAX arrays in and JAX arrays out, peak memory read
from ``VmHWM`` (reset through ``/proc/self/clear_refs`` just before the
operation) minus the resident size just before it. The data is incompressible
float32 (``--gib``, default 1 GiB) sharded by rows over 8 CPU devices. Three
sides run in every round, in an order rotated from round to round:

* **limit**: save = write the shards' bytes to one file and ``fsync`` it;
  restore = read that file into 64-byte-aligned buffers, one per shard, and
  ``jax.device_put`` each (JAX adopts them without a copy). Like orbax (whose
  tensorstore writes and reads the chunks of every shard at once) and our
  format on top of it, the limit works on all shards at once: one thread per
  shard writes (``pwrite``) or reads (``preadv``) the shard at its own offset;
* **orbax**: ``StandardCheckpointer.save`` / ``.restore`` with the abstract target;
* **jaxstruct**: ``export(format="orbax")`` / ``load(target=...)``.

Restores read from the page cache (the round's saves just wrote the files),
into a target sharded by columns (resharding: every stored chunk feeds every
shard); the limit reads without resharding.

Targets (issue 10), as same-run ratios (median of the per-round ratios):

* save time <= 1.0x orbax's, peak RSS growth <= 0.3 GiB (worst round);
* restore time <= 1.0x orbax's, peak RSS growth <= 1.1x the data (worst round);
* the blocking part of ``export(blocking=False)`` <= 5% of a blocking export;
* many small arrays (``--small``, 0 to skip): the built-in zip format >= 10x
  faster than orbax.

Run:  uv run --frozen --all-packages python benchmarks/bench_orbax.py [--gib 1] [--check]
(``--quick`` = 0.125 GiB, 2 rounds and 5,000 small arrays, for a smoke run;
``--check`` exits with status 1 when a target is missed.)

``--check-cost`` measures instead what the CRC-32 check of every stored unit costs
(issue 36: at most 5% of a load): one checkpoint of ``--gib`` (0.5 by default there)
sharded by rows is restored into the stored shards, into a resharded target and as
NumPy, ``--rounds`` times each (default 7) with the check on and off (the private
switch ``jaxstruct.orbax._read._CHECK``), alternating, in one process; wall time and
CPU time (``time.process_time``, all threads) as medians with their ranges, and the
CPU time spent in the CRC-32s themselves as a share of the restore's wall and CPU time
(medians; on a loaded machine the only figure steadier than the noise).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse
import concurrent.futures
import gc
import json
import shutil
import statistics
import sys
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
from _fresh import run_child
from _memory import aligned, reset_peak, status
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

HERE = Path(__file__).resolve()
COLS = 4096

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


# --------------------------------------------------------------------------- child side


def _measure(op: Callable[[], Any]) -> dict[str, float]:
    """Seconds and peak RSS growth of ``op()``; its result stays alive until measured."""
    gc.collect()
    gc.disable()
    reset_peak()  # VmHWM := VmRSS
    # Read after the reset: memory freed in between (JAX releases buffers
    # asynchronously) can only make the growth look larger, never smaller.
    base = status("VmRSS")
    t0 = time.perf_counter()
    result = op()
    elapsed = time.perf_counter() - t0
    peak = status("VmHWM") - base
    del result
    gc.enable()
    return {"seconds": elapsed, "peak": peak}


def _shape(gib: float) -> tuple[int, int]:
    return max(8, int(gib * GiB) // (4 * COLS) // 8 * 8), COLS


def _on_threads(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run ``jobs`` at once, one thread each (as many as shards), and return their results."""
    with concurrent.futures.ThreadPoolExecutor(max(1, len(jobs))) as workers:
        return [f.result() for f in [workers.submit(job) for job in jobs]]


def _write_raw(arr: jax.Array, path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    row_bytes = arr.shape[1] * arr.dtype.itemsize

    def write(shard: Any) -> None:
        view = memoryview(np.asarray(shard.data)).cast("B")  # pyright: ignore[reportArgumentType]
        offset = (shard.index[0].start or 0) * row_bytes
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)

    try:
        _on_threads([lambda shard=shard: write(shard) for shard in arr.addressable_shards])
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_raw(path: Path, shape: tuple[int, int], sharding: NamedSharding) -> jax.Array:
    fd = os.open(path, os.O_RDONLY)

    def read(device: Any, index: Any) -> Any:
        rows = range(*(index[0] if index else slice(None)).indices(shape[0]))
        nbytes = len(rows) * shape[1] * 4
        buf = aligned(nbytes)
        view = memoryview(buf)  # pyright: ignore[reportArgumentType]
        done = 0
        while done < nbytes:
            done += os.preadv(fd, [view[done:]], rows.start * shape[1] * 4 + done)
        host = buf.view(np.float32).reshape(len(rows), shape[1])
        return jax.device_put(host, device)

    try:
        placed = sharding.addressable_devices_indices_map(shape).items()
        arrays = _on_threads([lambda d=d, i=i: read(d, i) for d, i in placed])
    finally:
        os.close(fd)
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _save_op(side: str, arr: jax.Array, path: Path) -> Callable[[], Any]:
    if side == "limit":
        return lambda: _write_raw(arr, path)
    if side == "orbax":

        def orbax_save() -> None:
            checkpointer = ocp.StandardCheckpointer()
            checkpointer.save(path, {"w": arr})
            checkpointer.wait_until_finished()
            checkpointer.close()

        return orbax_save
    if side == "async":

        def async_save() -> jio.ExportHandle:
            return jio.export({"w": arr}, path, format="orbax", blocking=False)

        return async_save
    return lambda: jio.export({"w": arr}, path, format="orbax")


def _restore_op(side: str, path: Path, shape: tuple[int, int]) -> Callable[[], Any]:
    mesh = jax.make_mesh((8,), ("x",))
    if side == "limit":
        return lambda: _read_raw(path, shape, NamedSharding(mesh, P("x")))
    target = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P(None, "x")))
    if side == "orbax":

        def orbax_restore() -> jax.Array:
            checkpointer = ocp.StandardCheckpointer()
            out = checkpointer.restore(path, {"w": target})["w"].block_until_ready()
            checkpointer.close()
            return out

        return orbax_restore

    def ours_restore() -> jax.Array:
        return jio.load(path, target={"w": target})["w"].block_until_ready()

    return ours_restore


def _child(job: dict[str, Any]) -> dict[str, Any]:
    kind, side, path = job["kind"], job["side"], Path(job["path"])
    warm = Path(job["warm"])
    mesh = jax.make_mesh((8,), ("x",))
    rows = NamedSharding(mesh, P("x"))
    tiny = _data(8, 8, rows)
    shape = _shape(job["gib"])
    if kind == "save":
        arr = _data(*shape, rows)
        # Warm up: the same operation on a tiny array, then the real one, timed.
        done = _save_op(side, tiny, warm / side)()
        if isinstance(done, jio.ExportHandle):
            done.wait()
        handles: list[Any] = []

        def op() -> Any:
            handles.append(_save_op(side, arr, path)())
            return handles[-1]

        result = _measure(op)  # for "async": the blocking part only
        for handle in handles:
            if isinstance(handle, jio.ExportHandle):
                handle.wait()
        return result
    # restore: warm up on a tiny checkpoint of the same side
    tiny_path = warm / side
    if side == "limit":
        _write_raw(tiny, tiny_path)
    else:
        _save_op(side, tiny, tiny_path)()
    _restore_op(side, tiny_path, (8, 8))()
    return _measure(_restore_op(side, path, shape))


def bench_check_cost(root: Path, gib: float, rounds: int) -> list[str]:
    """Markdown rows: per read kind, wall and CPU time with the check on and off."""
    from jaxstruct.orbax import _read

    mesh = jax.make_mesh((8,), ("x",))
    shape = _shape(gib)
    path = root / "check-cost"
    jio.export({"w": _data(*shape, NamedSharding(mesh, P("x")))}, path, format="orbax")
    stored = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P("x")))

    def into_stored_shards() -> jax.Array:
        return jio.load(path, target={"w": stored})["w"].block_until_ready()

    reads: dict[str, Callable[[], Any]] = {
        "into the stored shards": into_stored_shards,
        "resharded (by columns)": _restore_op("ours", path, shape),
        "as NumPy": lambda: jio.load(path)["w"],
    }
    # The CPU time of the CRC-32s themselves (each on the tensorstore thread that completes
    # its unit's read), summed over one restore: a figure the load of a shared machine
    # moves less than the others.
    crc_cpu = [0.0]
    crc_lock = threading.Lock()
    crc = vars(_read)["bytes_crc"]  # the name _read checks with, wrapped for the count

    def timed_crc(data: Any) -> int:
        start = time.thread_time()
        try:
            return crc(data)
        finally:
            spent = time.thread_time() - start
            with crc_lock:
                crc_cpu[0] += spent

    setattr(_read, "bytes_crc", timed_crc)  # noqa: B010  # a name _read keeps private
    rows = []
    for name, read in reads.items():
        read()  # warm: the page cache, JAX's compilations
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        shares: list[tuple[float, float]] = []  # the CRCs' CPU time / the restore's wall, CPU
        for r in range(rounds):
            for check in (True, False) if r % 2 == 0 else (False, True):
                _read._CHECK = check  # the private switch, on purpose
                gc.collect()
                crc_cpu[0] = 0.0
                wall, cpu = time.perf_counter(), time.process_time()
                result = read()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                times[check].append((wall, cpu))
                if check:
                    shares.append((crc_cpu[0] / wall, crc_cpu[0] / cpu))
                del result
        _read._CHECK = True

        def cell(check: bool, i: int, times: dict[bool, list[tuple[float, float]]] = times) -> str:
            got = [t[i] for t in times[check]]
            return f"{statistics.median(got):.3f} ({min(got):.3f}-{max(got):.3f})"

        medians = {c: [statistics.median(t[i] for t in times[c]) for i in (0, 1)] for c in times}
        ratios = [f"{medians[True][i] / medians[False][i] - 1:+.1%}" for i in (0, 1)]
        share = [statistics.median(s[i] for s in shares) for i in (0, 1)]
        rows.append(
            f"| {name} | {cell(True, 0)} | {cell(False, 0)} | {ratios[0]} "
            f"| {cell(True, 1)} | {cell(False, 1)} | {ratios[1]} "
            f"| {share[0]:.1%} | {share[1]:.1%} |"
        )
    setattr(_read, "bytes_crc", crc)  # noqa: B010
    return rows


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


# --------------------------------------------------------------------------- parent side

SIDES = ("limit", "orbax", "ours")


def _run(job: dict[str, Any]) -> dict[str, Any]:
    return run_child(HERE, job)


def _rotated(items: tuple[str, ...], r: int) -> tuple[str, ...]:
    shift = r % len(items)
    return items[shift:] + items[:shift]


def _measure_rounds(root: Path, gib: float, rounds: int) -> dict[str, list[dict[str, float]]]:
    """``"save-orbax"``, ``"restore-ours"``... -> one measurement per round."""
    results: dict[str, list[dict[str, float]]] = {}
    for r in range(rounds):
        print(f"[bench_orbax] round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        for kind, sides in (("save", (*SIDES, "async")), ("restore", SIDES)):
            for side in _rotated(sides, r):
                path = root / f"save-{side}"
                if kind == "save":
                    _fresh(root, path.name)
                    os.sync()
                warm = _fresh(root, "warm")
                warm.mkdir()
                job = {"kind": kind, "side": side, "path": str(path), "warm": str(warm), "gib": gib}
                results.setdefault(f"{kind}-{side}", []).append(_run(job))
    return results


class Row:
    """One line of the report: the three sides' figures, our ratio and its target."""

    def __init__(self, measure: str, cells: tuple[str, ...], ratios: list[float]) -> None:
        self.measure, self.cells, self.ratios = measure, cells, ratios

    def line(self, target: float, unit: str) -> tuple[str, bool]:
        med = statistics.median(self.ratios)
        spread = f"{min(self.ratios):{unit}}-{max(self.ratios):{unit}}"
        ok = med <= target
        ratio = f"{med:{unit}} ({spread})" if len(self.ratios) > 1 else f"{med:{unit}}"
        cells = " | ".join(self.cells)
        verdict = "met" if ok else "**missed**"
        return f"| {self.measure} | {cells} | {ratio} | <= {target:{unit}} | {verdict} |", ok


def _report(results: dict[str, list[dict[str, float]]], gib: float) -> list[tuple[str, bool]]:
    nbytes = _shape(gib)[0] * COLS * 4
    size = f"{nbytes / GiB:.3g} GiB"

    def secs(key: str) -> list[float]:
        return [m["seconds"] for m in results[key]]

    def worst(key: str, scale: float) -> float:
        return max(m["peak"] for m in results[key]) / scale

    def med(key: str) -> str:
        return f"{statistics.median(secs(key)):.2f} s"

    lines = []
    for kind, what in (
        ("save", f"save {size} (8 shards): time"),
        ("restore", f"restore {size} into a resharded target: time"),
    ):
        cells = (med(f"{kind}-limit"), med(f"{kind}-orbax"), med(f"{kind}-ours"))
        ratios = [o / b for o, b in zip(secs(f"{kind}-ours"), secs(f"{kind}-orbax"), strict=True)]
        lines.append(Row(what, cells, ratios).line(1.0, ".2f"))
        if kind == "save":
            cells = tuple(f"+{worst(f'save-{s}', GiB):.2f} GiB" for s in SIDES)
            peak = Row("save: peak RSS growth (worst round)", cells, [worst("save-ours", GiB)])
            lines.append(peak.line(0.3, ".2f"))
        else:
            cells = tuple(f"+{worst(f'restore-{s}', nbytes):.2f}x data" for s in SIDES)
            peak = Row(
                "restore: peak RSS growth (worst round)", cells, [worst("restore-ours", nbytes)]
            )
            lines.append(peak.line(1.1, ".2f"))
    blocking = secs("save-async")
    ratios = [a / s for a, s in zip(blocking, secs("save-ours"), strict=True)]
    cells = ("", "", f"{statistics.median(blocking):.3f} s")
    lines.append(
        Row("blocking part of an async save / blocking save", cells, ratios).line(0.05, ".1%")
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the sharded array")
    parser.add_argument("--small", type=int, help="small arrays (default 100,000; 0: skip)")
    parser.add_argument(
        "--rounds", "--repeats", type=int, default=3, help="fresh-process rounds per figure"
    )
    parser.add_argument("--quick", action="store_true", help="0.125 GiB, 2 rounds, 5,000 small")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--check-cost", action="store_true", help="the cost of the CRC-32 check (see above)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    if args.check_cost:
        gib = args.gib if "--gib" in (argv or sys.argv) else 0.5
        rounds = args.rounds if {"--rounds", "--repeats"} & set(argv or sys.argv) else 7
        root = Path(tempfile.mkdtemp(prefix="bench-orbax-"))
        try:
            rows = bench_check_cost(root, gib, rounds)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        load = os.getloadavg()
        print(
            f"### the CRC-32 check of every stored unit, {gib:g} GiB ({os.cpu_count()} cores, "
            f"load average {load[0]:.1f} at the end, {rounds} rounds each way)\n"
        )
        print(
            "| restore | wall, check on (s) | wall, off | wall cost "
            "| CPU, check on (s) | CPU, off | CPU cost | CRC CPU / wall | CRC CPU / CPU |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(rows))
        return 0
    if args.quick:
        args.gib, args.rounds = 0.125, 2
    if args.small is None:
        args.small = 5_000 if args.quick else 100_000
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="bench-orbax-"))
    try:
        lines = _report(_measure_rounds(root, args.gib, args.rounds), args.gib)
        if args.small:
            print("[bench_orbax] many small arrays", file=sys.stderr, flush=True)
            name, orbax_time, faster, target = bench_small(root, args.small, args.rounds)
            ok = float(faster.split("x")[0]) >= 10
            verdict = "met" if ok else "**missed**"
            lines.append((f"| {name} | | {orbax_time} | | {faster} | {target} | {verdict} |", ok))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(
        f"### jaxstruct orbax format vs orbax-checkpoint ({os.cpu_count()} cores, load average "
        f"{load[0]:.1f} at the end, {args.rounds} fresh-process rounds, "
        f"{time.perf_counter() - started:.0f} s)\n"
    )
    print("| measure | limit | orbax | jaxstruct | jaxstruct / orbax | target | result |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for line, _ in lines:
        print(line)
    missed = [line for line, ok in lines if not ok]
    if missed:
        print(f"\n[bench_orbax] {len(missed)} target(s) missed", file=sys.stderr)
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
