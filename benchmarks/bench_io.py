"""Benchmark of jaxstruct.io against raw file I/O and NumPy, as same-run ratios.

Run with ``uv run python benchmarks/bench_io.py [--rounds N]``. The data is
256 MiB of random float32 in 64 arrays (random floats do not compress, the
worst case). Each comparison alternates the two sides for N rounds (default
5), starting every write from an empty, synced disk, and reports the median
of the per-round ratios.
Targets (from issue 4):

* default export <= 3x a raw write of the same bytes (both include fsync, which
  export needs for durability);
* load <= 3x a raw read, peak extra memory <= 1.25x the data;
* compression="deflate" <= 0.5x numpy.savez_compressed;
* .zip export <= 1.1x directory export;
* to_state_dict / from_state_dict copy no array data.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import jaxstruct.io as jio
import numpy as np

N_ARRAYS = 64
TOTAL = 256 << 20


def make_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    per = TOTAL // N_ARRAYS // 4
    return {f"w{i}": rng.standard_normal(per, dtype=np.float32) for i in range(N_ARRAYS)}


def best(
    fn: Callable[[], object], repeat: int = 3, setup: Callable[[], object] | None = None
) -> float:
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def paired(
    ours: Callable[[], object],
    base: Callable[[], object],
    setup: Callable[[], object],
    rounds: int,
) -> tuple[float, float, float]:
    """Time ``ours`` and ``base`` alternately, ``setup`` before each (its time not counted).

    Returns the median time of each and the median of the per-round ratios:
    disk timings drift (page cache, writeback of earlier rounds), so only
    measurements taken side by side are compared.
    """
    a_times, b_times, ratios = [], [], []
    for i in range(rounds):
        pair = []
        for fn in (ours, base) if i % 2 == 0 else (base, ours):
            setup()
            t = time.perf_counter()
            fn()
            pair.append((fn, time.perf_counter() - t))
        a = next(t for fn, t in pair if fn is ours)
        b = next(t for fn, t in pair if fn is base)
        a_times.append(a)
        b_times.append(b)
        ratios.append(a / b)
    return statistics.median(a_times), statistics.median(b_times), statistics.median(ratios)


def rss_peak_during(fn: Callable[[], object]) -> tuple[float, int]:
    """Run ``fn`` and return (seconds, peak RSS growth in bytes) sampled from /proc."""

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    base = rss()
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss())
            time.sleep(0.002)

    thread = threading.Thread(target=sample)
    thread.start()
    t = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t
    done.set()
    thread.join()
    peak = max(peak, rss())
    del result
    return elapsed, peak - base


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per pair")
    parser.add_argument(
        "--check", action="store_true", help="exit with status 1 when a target is missed"
    )
    args = parser.parse_args(argv)
    data = make_data()
    nbytes = sum(a.nbytes for a in data.values())
    blob = b"".join(a.tobytes() for a in data.values())
    root = Path(tempfile.mkdtemp(prefix="jaxstruct-bench-"))
    rows: list[tuple[str, float, float, float, float, str]] = []
    try:
        raw = root / "raw.bin"

        def raw_write() -> None:
            with open(raw, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())

        def fresh() -> None:
            # Each write starts from the same state: no earlier output, no dirty pages.
            for path in (raw, root / "d", root / "z.zip"):
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
            os.sync()

        t_dir, t_raw_w, r_dir = paired(
            lambda: jio.export(data, root / "d"), raw_write, fresh, args.rounds
        )
        t_zip, t_dir2, r_zip = paired(
            lambda: jio.export(data, root / "z.zip"),
            lambda: jio.export(data, root / "d"),
            fresh,
            args.rounds,
        )
        t_defl = best(
            lambda: jio.export(data, root / "c.zip", compression="deflate"),
            setup=lambda: (root / "c.zip").unlink(missing_ok=True),
            repeat=1,
        )
        t_savez = best(lambda: np.savez_compressed(root / "np.npz", **data), repeat=1)

        fresh()
        raw_write()
        jio.export(data, root / "d")

        def raw_read() -> bytes:
            with open(raw, "rb") as f:
                return f.read()

        raw_read()
        jio.load(root / "d")
        t_load, t_raw_r, r_load = paired(
            lambda: jio.load(root / "d"), raw_read, lambda: None, args.rounds
        )
        _, peak = rss_peak_during(lambda: jio.load(root / "d"))

        tracemalloc.start()
        state = jio.to_state_dict(data)
        back = jio.from_state_dict(state)
        copied = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        shares = all(back[k] is data[k] for k in data)

        rows = [
            ("export (directory, auto) / raw write+fsync", t_dir, t_raw_w, r_dir, 3.0, ""),
            ("load (directory) / raw read", t_load, t_raw_r, r_load, 3.0, ""),
            (
                "load peak RSS growth / data size",
                peak / nbytes,
                1.0,
                peak / nbytes,
                1.25,
                f"{peak / 2**20:.0f} MiB",
            ),
            (
                "export deflate / numpy.savez_compressed",
                t_defl,
                t_savez,
                t_defl / t_savez,
                0.5,
                "",
            ),
            ("export .zip / export directory", t_zip, t_dir2, r_zip, 1.1, ""),
            (
                "to+from_state_dict peak alloc / data size",
                copied / nbytes,
                1.0,
                copied / nbytes,
                0.01,
                f"shares arrays: {shares}",
            ),
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"data: {nbytes / 2**20:.0f} MiB float32 in {N_ARRAYS} arrays, {os.cpu_count()} cores")
    print(f"{'measure':<46} {'ours':>9} {'baseline':>9} {'ratio':>7} {'target':>7}  ok")
    failed = 0
    for name, ours, base, ratio, target, note in rows:
        ok = ratio <= target
        failed += not ok
        print(
            f"{name:<46} {ours:>9.3f} {base:>9.3f} {ratio:>7.2f} {target:>7.2f}  "
            f"{'yes' if ok else 'NO'} {note}"
        )
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
