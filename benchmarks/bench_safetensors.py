"""Safetensors files: jaxstruct-safetensors against the safetensors library's own flax functions.

Every figure is measured in a fresh Python process (imports and a tiny warm-up
first, not timed), JAX arrays in and JAX arrays out, on ``--gib`` (default 1)
GiB of incompressible float32 in 64 tensors. Peak memory is ``VmHWM`` (reset
through ``/proc/self/clear_refs`` just before the operation) minus the resident
size just before it. Two sides run in every round, in an order rotated from
round to round:

* **safetensors**: ``safetensors.flax.save_file`` / ``load_file``;
* **jaxstruct**: ``jaxstruct.io.export(tensors, "x.safetensors")`` / ``load``.

Loads read from the page cache (the round's saves just wrote the files).

An export does more than ``save_file``: it flushes the file to disk (``fsync``)
and publishes it atomically (a rename), so the export is compared with
``save_file`` followed by an ``fsync`` of the file (the same durability; issue
35), and its own time is split into its parts (encoding the manifest, writing
the file, which is ``safetensors.serialize_file`` for these CPU arrays, after
the checksums of every 1 MiB, the ``fsync``, publishing). ``save_file`` alone
is shown too. The machine may be shared: every ratio is shown with its spread
over the rounds.

Targets (issues 23 and 35), as same-run ratios (median of the per-round ratios):

* export time <= 1.0x ``save_file`` + ``fsync``'s; load time <= 1.0x ``load_file``'s
  (every byte checked against its checksum, which ``load_file`` does not do);
* load peak RSS growth <= 1.1x the data (worst round; the library's shown too);
* ``load(select=...)`` of one tensor out of 64 reads < 2% of the file's bytes
  (``rchar`` of ``/proc/self/io``: every byte a read call returned).

Run:  uv run --frozen --all-packages python benchmarks/bench_safetensors.py [--gib 1] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
TENSORS = 64
COLS = 4096
GiB = 1 << 30


def _io(field: str) -> int:
    with open("/proc/self/io") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/io")


def _tensors(nbytes: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    rows = max(1, nbytes // TENSORS // (COLS * 4))
    rng = np.random.default_rng(0)
    return {
        f"layers.{i}.w": jnp.asarray(rng.standard_normal((rows, COLS), np.float32))
        for i in range(TENSORS)
    }


def child(side: str, op: str, path: str, nbytes: int) -> dict[str, float]:
    """One measurement in this (fresh) process."""
    import jax
    import jaxstruct.io as jio
    import safetensors.flax
    from _memory import reset_peak, status

    tiny = Path(path).with_name(f"warm-{side}-{op}.safetensors")
    save: Any = jio.export
    load: Any = jio.load
    if side == "safetensors":
        save = lambda t, p: safetensors.flax.save_file(t, str(p))
        load = lambda p: safetensors.flax.load_file(str(p))
    save({"w": jax.numpy.ones(4)}, tiny)
    load(tiny)
    tiny.unlink()
    data = _tensors(nbytes) if op == "save" else None
    jax.block_until_ready(data)
    marks: list[tuple[str, float]] = []
    hook = _step_hook(marks) if side == "jaxstruct" and op == "save" else None
    reset_peak()
    before, read_before = status("VmRSS"), _io("rchar")
    start = time.perf_counter()
    durable = None
    if op == "save":
        save(data, Path(path))
        out = None
        if side == "safetensors":  # export fsyncs the file (and publishes it atomically)
            durable = time.perf_counter()
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            durable = time.perf_counter() - durable
    elif op == "select":
        out = jio.load(path, select=lambda s: s["layers.17.w"])
    else:
        out = load(Path(path))
    jax.block_until_ready(out)
    seconds = time.perf_counter() - start
    if hook is not None:
        hook()
    if durable is not None:
        seconds -= durable
    return {
        **_parts(marks, start),
        "seconds": seconds,
        "durable": seconds + (durable or 0.0),
        "peak": status("VmHWM") - before,
        "read": _io("rchar") - read_before,
        "data": sum(x.nbytes for x in jax.tree.leaves(out)) if out is not None else 0,
    }


#: Export steps (``jaxstruct.io``'s crash-test hook) -> the part of the time ending there.
_PARTS = {"encoded": "encode", "arrays-written": "write", "temp-synced": "fsync", "done": "publish"}


def _step_hook(marks: list[tuple[str, float]]) -> Any:
    """Record when each export step ends; return the function that removes the hook.

    (The hook is a private test hook of jaxstruct.io: without it, no parts are shown.)
    """
    try:
        from jaxstruct.io import _publish
    except ImportError:  # pragma: no cover - jaxstruct.io moved it
        return None
    if not hasattr(_publish, "STEP_HOOK"):  # pragma: no cover
        return None
    _publish.STEP_HOOK = lambda name: marks.append((name, time.perf_counter()))

    def remove() -> None:
        _publish.STEP_HOOK = None

    return remove


def _parts(marks: list[tuple[str, float]], start: float) -> dict[str, float]:
    out, last = {}, start
    for name, at in marks:
        if name in _PARTS:
            out[_PARTS[name]] = at - last
            last = at
    return out


def _warm(path: Path) -> None:
    """Read ``path`` once, so that both sides' loads read from the page cache.

    (On a shared machine the page cache evicts one side's file or the other's
    between runs, and a load from the disk measures the disk.)
    """
    with open(path, "rb", buffering=0) as handle:
        while handle.read(64 << 20):
            pass


def _run(side: str, op: str, path: Path, nbytes: int) -> dict[str, float]:
    if op == "save":
        # Start from no dirty pages: otherwise a save pays for the writeback of the
        # file the save before it left in the page cache (save_file's, unflushed).
        os.sync()
    else:
        _warm(path)
    code = (
        f"import sys, json; sys.path.insert(0, {str(HERE.parent)!r}); "
        f"import bench_safetensors as b; "
        f"print(json.dumps(b.child({side!r}, {op!r}, {str(path)!r}, {nbytes})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=1800
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    nbytes = int(args.gib * GiB)
    sides = ["safetensors", "jaxstruct"]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-safetensors-"))
    try:
        for round_ in range(args.rounds):
            order = sides[round_ % 2 :] + sides[: round_ % 2]
            for op in ("save", "load"):
                for side in order:
                    path = work / f"{side}.safetensors"
                    if op == "save" and path.exists():
                        path.unlink()
                    results.setdefault((side, op), []).append(_run(side, op, path, nbytes))
            results.setdefault(("jaxstruct", "select"), []).append(
                _run("jaxstruct", "select", work / "jaxstruct.safetensors", nbytes)
            )
        size = (work / "jaxstruct.safetensors").stat().st_size
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def ratios(op: str, theirs: str = "seconds") -> list[float]:
        pairs = zip(results[("jaxstruct", op)], results[("safetensors", op)], strict=True)
        return [a["seconds"] / b[theirs] for a, b in pairs]

    def ratio(op: str, theirs: str = "seconds") -> float:
        return statistics.median(ratios(op, theirs))

    def spread(op: str, theirs: str = "seconds") -> str:
        values = ratios(op, theirs)
        return f"{min(values):.2f}-{max(values):.2f}"

    data = max(r["data"] for r in results[("jaxstruct", "load")])
    rows = []
    for side in sides:
        for op in ("save", "load"):
            runs = results[(side, op)]
            rows.append(
                f"| {side} | {op} | {statistics.median(r['seconds'] for r in runs):.3f} s | "
                f"{max(r['peak'] for r in runs) / GiB:.3f} GiB |"
            )
    save_ratio, load_ratio = ratio("save"), ratio("load")
    durable_ratio = ratio("save", "durable")
    durable = statistics.median(r["durable"] for r in results[("safetensors", "save")])
    peak_ratio = max(r["peak"] for r in results[("jaxstruct", "load")]) / data
    theirs_peak = max(r["peak"] for r in results[("safetensors", "load")]) / data
    select_share = max(r["read"] for r in results[("jaxstruct", "select")]) / size
    targets = [
        ("export time / (safetensors.flax.save_file + fsync)", durable_ratio, 1.0),
        ("load time / safetensors.flax.load_file", load_ratio, 1.0),
        ("load peak / data", peak_ratio, 1.1),
        ("select= of 1 of 64 tensors: bytes read / file", select_share, 0.02),
    ]
    print(f"## safetensors: {data / GiB:.3f} GiB in {TENSORS} tensors, {args.rounds} rounds\n")
    print("| side | op | median time | worst peak RSS growth |\n|---|---|---|---|")
    print("\n".join(rows))
    saves = results[("jaxstruct", "save")]
    parts = ", ".join(
        f"{part} {statistics.median(r.get(part, 0.0) for r in saves):.3f} s"
        for part in _PARTS.values()
        if any(part in r for r in saves)
    )
    print(
        f"\n(safetensors.flax.load_file peak / data: {theirs_peak:.2f}x; save_file and an "
        f"fsync of its file: {durable:.3f} s, export / that over the rounds "
        f"{spread('save', 'durable')}; export / save_file alone {save_ratio:.3f})\n"
    )
    print(f"Export, median of each part: {parts or 'not recorded'}.")
    print(
        f"Per-round ratios, lowest-highest: export / save_file alone {spread('save')}, "
        f"load / load_file {spread('load')}.\n"
    )
    print("### Targets\n\n| target | measured | limit | verdict |\n|---|---|---|---|")
    missed = False
    for name, value, limit in targets:
        ok = value < limit if "select" in name else value <= limit
        missed |= not ok
        print(f"| {name} | {value:.3f} | {limit} | {'met' if ok else 'MISSED'} |")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
