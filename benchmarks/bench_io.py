"""Benchmark of jaxstruct.io against the physical limit of this machine, as same-run ratios.

Run with ``uv run --frozen --all-packages python benchmarks/bench_io.py [--rounds N]``.

Every figure is measured as a user would see it: in a fresh Python process
(jax imported and warmed up first, not timed), with JAX arrays in and JAX
arrays out, peak memory read from ``VmHWM`` in ``/proc/self/status`` (reset
with ``/proc/self/clear_refs`` just before the operation). Beside each figure
the same process kind measures the physical limit:

* **load limit**: read the same bytes from one file straight into 64-byte-aligned
  NumPy buffers (one per array) and hand each to ``jax.device_put``, which on
  the CPU takes the buffer without copying (peak = 1.0x the data);
* **export limit**: write the same bytes to one file and ``fsync`` it.

The data is 256 MiB of random float32 in 64 arrays (random data does not
compress: the worst case for ``compression="auto"``), plus one 4 GiB array
(``--big-gib``, 0 to skip). Each pair is measured ``--rounds`` times (default 3),
alternating which side runs first; the report gives the median of the
per-round ratios and their spread (min-max). Writes start from an empty,
``sync``-ed disk; loads read from the page cache (warm for both sides).

Targets (issue 13):

* load time <= 1.3x the limit and load peak <= 1.15x the data, for the 64
  arrays and for the 4 GiB array; after the result is dropped, at most 5% of
  the data is still resident before any ``gc.collect()`` (no reference cycle
  holds a buffer);
* export (``compression="auto"``) <= 1.6x the limit;
* small checkpoint (a Struct of 10 tiny arrays, ``overwrite=True`` export then
  load; issue 21): export+load cycles per second >= 0.9x those of
  ``numpy.savez`` + ``numpy.load`` (JAX arrays in and out; numpy does not
  fsync), and >= 1.0x those of numpy with the same durability (temporary file,
  fsync, rename, fsync of the directory). Reported as numpy's rate over ours, so
  the targets read <= 1/0.9 and <= 1.0. Also reported: a raw write+fsync+read of
  the bytes, and the floor of our layout (``_layout_floor``: the system calls our
  export and load make, with the same threads, and one ``jax.device_put``, with no
  Python work of ours), which says whether the first target is within reach of
  this disk at the time of the run;
* zip <= 1.1x directory, for export and for load (the median ratio of
  ``--zip-rounds`` pairs, half run in each order: the run that comes second in a
  pair is often slowed by the first, whichever it is).

Section ``bf16`` (issue 35): 256 MiB of random-normal bfloat16 weights in 64
arrays, as models keep them (deflate shrinks them to about 78%):

* with the defaults, load <= 1.3x its limit and export <= 1.6x its limit, as
  for float32;
* a ``compression="deflate"`` checkpoint loads in <= 0.85x the time one core
  takes to inflate its members with zlib-ng (one after another, into fresh
  buffers, the compressed bytes already in memory); its load against the
  same checkpoint stored is reported (the issue's target, 1.5x, is for a
  16-core machine), and so is the deflate export against write + fsync.

Every load reads files in the page cache (``_warm``: this machine's kernel
reclaims page cache on its own) into memory the fresh process never touched,
for ours and the limit alike, as a user's load meets it: page faults are part
of both sides' time.

``--check`` exits with status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _fresh import run_child
from _memory import aligned, reset_peak, status

N_ARRAYS = 64
TOTAL = 256 << 20
SMALL_ARRAYS = 10
# Small-cycle targets as numpy's rate over ours: ours >= 0.9x plain numpy (which does
# not fsync) and >= 1.0x numpy with the same durability.
SMALL_PLAIN_TARGET = round(1 / 0.9, 2)
SMALL_DURABLE_TARGET = 1.0
HERE = Path(__file__).resolve()

# --------------------------------------------------------------------------- child side


def _arrays(sizes: list[int], seed: int = 0, dtype: str = "float32") -> dict[str, Any]:
    """Random-normal arrays of ``sizes`` elements, as trained weights look."""
    import jax
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(seed)
    kind = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    return {
        f"w{i}": jax.device_put(rng.standard_normal(n, dtype=np.float32).astype(kind))
        for i, n in enumerate(sizes)
    }


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else 4


def _measure(op: Callable[[], Any], keep: bool = False) -> dict[str, Any]:
    """Time ``op`` and read the peak memory it added; also what stays resident after it."""
    import gc

    gc.collect()
    gc.disable()
    # Reset the peak first and take the baseline from it: RSS read before the reset
    # can be higher than at the reset (JAX frees buffers in the background), which
    # would understate the peak.
    reset_peak()
    base = status("VmHWM")
    t = time.perf_counter()
    result = op()
    elapsed = time.perf_counter() - t
    peak = status("VmHWM") - base
    if not keep:
        del result
        result = None
    # JAX releases the host buffers it adopted without copying at its next
    # garbage-collection callback; run that release alone (not Python's gc),
    # then ask Python's gc how many unreachable objects (cycles) are left.
    from jax._src.lib import _jax  # pyright: ignore[reportPrivateImportUsage]  # private: the benchmark only

    _jax.collect_garbage()
    left = status("VmRSS") - base
    cycles = gc.collect()
    gc.enable()
    return {"seconds": elapsed, "peak": peak, "left": left, "cycles": cycles}


def _warm(path: Path) -> int:
    """Read every file under ``path`` once, so that a load finds it in the page cache.

    The checkpoints were just written, but the kernel may have reclaimed some of
    their pages since (this machine runs a proactive reclaimer): a load that
    then reads from the disk says nothing about the format. Every load figure,
    ours and the limits', is taken warm. (The read goes through a small
    buffer, so it adds nothing to the peak.) Returns the bytes read.
    """
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    buf = bytearray(8 << 20)
    total = 0
    for file in files:
        with open(file, "rb", buffering=0) as handle:
            while n := handle.readinto(buf):
                total += n
    return total


def _layout_floor(checkpoint: Path, where: Path, rebuild: Callable[[list[Any]], Any]) -> Any:
    """Our small cycle's system calls alone, as ``export(overwrite=True)`` + ``load`` make them.

    Returns a function that replaces the directory checkpoint ``where`` by a
    copy of ``checkpoint``'s two files (temporary directory, both files
    written, writeback started, the files and the directory fsynced at once
    on threads, ``renameat2(RENAME_EXCHANGE)``, the old checkpoint deleted on
    a thread while the parent is fsynced), then reads both files through one
    directory descriptor and hands the arrays to ``rebuild`` (one
    ``jax.device_put``). No Python work of ours: the floor of our layout and
    durability on this disk. ``None`` where Linux's calls are missing.
    """
    import ctypes
    import secrets
    import zipfile
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2, sync_file_range = libc.renameat2, libc.sync_file_range
    except (AttributeError, OSError):
        return None
    sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    files = {name: (checkpoint / name).read_bytes() for name in ("arrays.npz", "manifest.json")}
    members = []  # (dtype, count, offset of the data in arrays.npz)
    with zipfile.ZipFile(checkpoint / "arrays.npz") as archive:
        for info in archive.infolist():
            local = files["arrays.npz"][info.header_offset : info.header_offset + 30]
            start = info.header_offset + 30 + int.from_bytes(local[26:28], "little")
            start += int.from_bytes(local[28:30], "little")
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(member)
                members.append((dtype, int(np.prod(shape)), start + member.tell()))
    shutil.copytree(checkpoint, where)
    threads = ThreadPoolExecutor(2)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    noatime = getattr(os, "O_NOATIME", 0)  # as our reads: no inode update on the first read

    def sync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)

    def delete(old: Path) -> None:
        for name in files:
            os.unlink(old / name)
        os.rmdir(old)

    def cycle() -> Any:
        tmp = where.with_name(f".{where.name}.tmp-{secrets.token_hex(6)}")
        tmp.mkdir()
        fds = []
        for name, data in files.items():
            fds.append(os.open(tmp / name, flags, 0o666))
            os.write(fds[-1], data)
        fds.append(os.open(tmp, os.O_RDONLY | os.O_DIRECTORY))
        for fd in fds[:2]:
            sync_file_range(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE
        pending = [threads.submit(os.fsync, fd) for fd in fds[1:]]
        os.fsync(fds[0])
        for future in pending:
            future.result()
        for fd in fds:
            os.close(fd)
        if renameat2(-100, bytes(tmp), -100, bytes(where), ctypes.c_uint(2)) != 0:
            raise OSError(ctypes.get_errno(), "renameat2", str(where))
        deleting = threads.submit(delete, tmp)
        sync_dir(where.parent)
        deleting.result()
        dirfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
        read = {}
        for name, data in files.items():
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | noatime, dir_fd=dirfd)
            read[name] = os.pread(fd, len(data), 0)
            os.close(fd)
        os.close(dirfd)
        blob = read["arrays.npz"]
        return rebuild([np.frombuffer(blob, dt, n, at) for dt, n, at in members])

    return cycle


def _child(job: dict[str, Any]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import jaxstruct.io as jio
    import numpy as np

    jax.block_until_ready(jnp.ones(4) + 1)  # warm up the backend outside the timing
    kind = job["kind"]
    path = Path(job["path"])
    sizes: list[int] = job.get("sizes", [])
    dtype: str = job.get("dtype", "float32")
    item = _itemsize(dtype)
    compression: str = job.get("compression", "auto")

    if kind == "prepare":  # write the checkpoint(s) and the raw file the limits read
        data = _arrays(sizes, dtype=dtype)
        for target in job["targets"]:
            jio.export(data, target, overwrite=True, compression=compression)
        with open(path, "wb") as f:
            for arr in data.values():
                f.write(np.asarray(arr).view(np.uint8).data)
        return {}

    # Loads read warm files into memory this fresh process never touched: as a user's
    # load meets it, page faults included, for both sides alike.
    if kind in ("load", "load-limit", "inflate"):
        _warm(path)

    if kind == "inflate":  # one core inflating every member of arrays.npz, one after another
        import zipfile

        from zlib_ng import zlib_ng

        npz = path / "arrays.npz"
        blobs = []
        with zipfile.ZipFile(npz) as archive, open(npz, "rb") as handle:
            for info in archive.infolist():
                handle.seek(info.header_offset + 26)
                skip = int.from_bytes(handle.read(2), "little") + int.from_bytes(
                    handle.read(2), "little"
                )
                handle.seek(info.header_offset + 30 + skip)
                blobs.append((handle.read(info.compress_size), info.file_size))

        def inflate() -> Any:
            return [zlib_ng.decompress(blob, -15, size) for blob, size in blobs]

        return _measure(inflate)

    if kind == "load":

        def op() -> Any:
            out = jio.load(path)
            jax.block_until_ready(out)
            return out

        return _measure(op)

    if kind == "load-limit":
        kind_of = np.uint16 if item == 2 else np.float32

        def op() -> Any:
            out = {}
            fd = os.open(path, os.O_RDONLY)
            try:
                pos = 0
                for i, n in enumerate(sizes):
                    buf = aligned(item * n)
                    view = memoryview(buf)  # pyright: ignore[reportArgumentType]
                    done = 0
                    while done < len(view):
                        done += os.preadv(fd, [view[done:]], pos + done)
                    pos += item * n
                    out[f"w{i}"] = jax.device_put(buf.view(kind_of), jax.devices()[0])
            finally:
                os.close(fd)
            jax.block_until_ready(out)
            return out

        return _measure(op)

    if kind in ("export", "export-limit"):
        data = _arrays(sizes, seed=1, dtype=dtype)
        jax.block_until_ready(data)
        if kind == "export":
            return _measure(lambda: jio.export(data, path, compression=compression))

        def raw() -> None:
            with open(path, "wb", buffering=0) as f:
                for arr in data.values():
                    f.write(np.asarray(arr).view(np.uint8).data)
                os.fsync(f.fileno())

        return _measure(raw)

    if kind == "small":
        import jaxstruct.core as js

        class Small(js.Struct):
            a0: jax.Array
            a1: jax.Array
            a2: jax.Array
            a3: jax.Array
            a4: jax.Array
            a5: jax.Array
            a6: jax.Array
            a7: jax.Array
            a8: jax.Array
            a9: jax.Array

        value = Small(
            **{f"a{i}": jnp.arange(8, dtype=jnp.float32) + i for i in range(SMALL_ARRAYS)}
        )
        names = [f"a{i}" for i in range(SMALL_ARRAYS)]
        target = path / "ck"
        npz = path / "ck.npz"

        def ours() -> None:
            jio.export(value, target, overwrite=True)
            jio.load(target, load_cls=Small)

        # numpy as a user would run it: JAX arrays in (np.asarray of each field) and
        # JAX arrays out (jnp.asarray of each array read), the Struct rebuilt.
        def numpy_save(handle: Any) -> None:
            np.savez(handle, **{k: np.asarray(getattr(value, k)) for k in names})  # pyright: ignore[reportArgumentType]

        def numpy_load() -> Any:
            with np.load(npz, allow_pickle=False) as f:
                return Small(**{k: jnp.asarray(f[k]) for k in names})

        def numpy_cycle() -> None:
            numpy_save(npz)  # no fsync, no atomic publish
            numpy_load()

        def numpy_durable() -> None:
            # The same promises as ours: temporary file, fsync, rename, fsync the directory.
            tmp = path / ".ck.npz.tmp"
            with open(tmp, "wb") as f:
                numpy_save(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, npz)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            numpy_load()

        blob = b"".join(np.asarray(getattr(value, k)).tobytes() for k in names)

        def raw_cycle() -> None:
            with open(path / "raw", "wb", buffering=0) as f:
                f.write(blob)
                os.fsync(f.fileno())
            with open(path / "raw", "rb") as f:
                f.read()

        fns = {"ours": ours, "numpy": numpy_cycle, "numpy_durable": numpy_durable, "raw": raw_cycle}
        ours()
        floor = _layout_floor(
            target,
            path / "floor",
            lambda arrays: Small(**dict(zip(names, jax.device_put(arrays), strict=True))),
        )
        if floor is not None:
            fns["floor"] = floor
        rates: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn()
        for r in range(job["rounds"]):
            order = list(fns) if r % 2 == 0 else list(reversed(fns))
            for name in order:
                n = 0
                t = time.perf_counter()
                while n < 20 or time.perf_counter() - t < 0.5:
                    fns[name]()
                    n += 1
                rates[name].append(n / (time.perf_counter() - t))
        return rates

    raise ValueError(f"unknown job kind {kind!r}")


# --------------------------------------------------------------------------- parent side


def _run(job: dict[str, Any]) -> dict[str, Any]:
    return run_child(HERE, job, env={"JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD": "1"})


def _clear(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    os.sync()


class Row:
    """One reported comparison: our figure, the limit's, and the per-round ratios."""

    def __init__(self, name: str, unit: str, target: float | None, note: str = "") -> None:
        self.name, self.unit, self.target, self.note = name, unit, target, note
        self.ours: list[float] = []
        self.limit: list[float] = []
        self.ratios: list[float] = []

    def add(self, ours: float, limit: float, ratio: float | None = None) -> None:
        self.ours.append(ours)
        self.limit.append(limit)
        self.ratios.append(ours / limit if ratio is None else ratio)

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def ok(self) -> bool:
        return self.target is None or self.ratio <= self.target

    def line(self) -> str:
        spread = f"{min(self.ratios):.2f}-{max(self.ratios):.2f}"
        target = "(none here)" if self.target is None else f"<= {self.target:.2f}"
        result = "info" if self.target is None else "pass" if self.ok else "FAIL"
        return (
            f"| {self.name} | {statistics.median(self.ours):.3f} {self.unit} | "
            f"{statistics.median(self.limit):.3f} {self.unit} | {self.ratio:.2f} ({spread}) | "
            f"{target} | {result} |" + (f" {self.note}" if self.note else "")
        )


def _paired(
    ours: dict[str, Any], limit: dict[str, Any], rounds: int, before: Callable[[], None]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    results = []
    for r in range(rounds):
        got: dict[str, dict[str, Any]] = {}
        for name in ("ours", "limit") if r % 2 == 0 else ("limit", "ours"):
            before()
            got[name] = _run(ours if name == "ours" else limit)
        results.append((got["ours"], got["limit"]))
    return results


def _load_rows(
    label: str, sizes: list[int], root: Path, rounds: int, dtype: str = "float32"
) -> list[Row]:
    nbytes = _itemsize(dtype) * sum(sizes)
    ck, raw = root / f"{label}-ck", root / f"{label}.raw"
    _run(
        {"kind": "prepare", "path": str(raw), "sizes": sizes, "targets": [str(ck)], "dtype": dtype}
    )
    t_row = Row(f"load {label}: time / aligned read + device_put", "s", 1.3)
    m_row = Row(f"load {label}: peak memory / data", "GiB", 1.15)
    l_row = Row(f"load {label}: resident after del, without Python's gc / data", "GiB", 0.05)
    gib = 1 << 30
    cycles = 0
    for ours, limit in _paired(
        {"kind": "load", "path": str(ck)},
        {"kind": "load-limit", "path": str(raw), "sizes": sizes, "dtype": dtype},
        rounds,
        lambda: None,
    ):
        t_row.add(ours["seconds"], limit["seconds"])
        m_row.add(ours["peak"] / gib, limit["peak"] / gib, ours["peak"] / nbytes)
        cycles = max(cycles, ours["cycles"])
        l_row.add(
            max(ours["left"], 0) / gib, max(limit["left"], 0) / gib, max(ours["left"], 0) / nbytes
        )
    m_row.note = f"(limit: {statistics.median(m_row.limit) * gib / nbytes:.2f}x the data)"
    l_row.note = f"(unreachable objects Python's gc found afterwards: {cycles})"
    _clear(ck, raw)
    return [t_row, m_row, l_row]


def _zip_rows(sizes: list[int], root: Path, rounds: int) -> list[Row]:
    """Export and load of the same data as a .zip and as a directory, in fresh-process pairs."""
    out, zout = root / "out", root / "out.zip"
    rounds += rounds % 2  # as many pairs in each order
    export_row = Row("export .zip / export directory", "s", 1.1)
    for ours, limit in _paired(
        {"kind": "export", "path": str(zout), "sizes": sizes},
        {"kind": "export", "path": str(out), "sizes": sizes},
        rounds,
        lambda: _clear(out, zout),
    ):
        export_row.add(ours["seconds"], limit["seconds"])
    _clear(out, zout)
    zck, dck, raw = root / "z.zip", root / "d", root / "zd.raw"
    _run({"kind": "prepare", "path": str(raw), "sizes": sizes, "targets": [str(zck), str(dck)]})
    load_row = Row("load .zip / load directory", "s", 1.1)
    for ours, limit in _paired(
        {"kind": "load", "path": str(zck)},
        {"kind": "load", "path": str(dck)},
        rounds,
        lambda: None,
    ):
        load_row.add(ours["seconds"], limit["seconds"])
    _clear(zck, dck, raw)
    # The median of the pairs' ratios: one pair whose load met a reclaimed page
    # cache (seen at 4.2x) no longer moves the figure by a quarter.
    note = f"(median of {rounds} fresh-process pairs, half in each order)"
    export_row.note = load_row.note = note
    return [export_row, load_row]


def _bf16_rows(sizes: list[int], root: Path, rounds: int) -> list[Row]:
    """bf16 random-normal weights: the default's load and export, and a deflated checkpoint."""
    rows = _load_rows("256 MiB bf16 / 64 arrays (auto)", sizes, root, rounds, "bfloat16")
    out = root / "bf16-out"
    export = Row("export 256 MiB bf16 (auto): time / write + fsync", "s", 1.6)
    for ours, limit in _paired(
        {"kind": "export", "path": str(out), "sizes": sizes, "dtype": "bfloat16"},
        {"kind": "export-limit", "path": str(out), "sizes": sizes, "dtype": "bfloat16"},
        rounds,
        lambda: _clear(out),
    ):
        export.add(ours["seconds"], limit["seconds"])
    rows.append(export)
    d_export = Row("export 256 MiB bf16 (deflate): time / write + fsync", "s", None)
    for ours, limit in _paired(
        {
            "kind": "export",
            "path": str(out),
            "sizes": sizes,
            "dtype": "bfloat16",
            "compression": "deflate",
        },
        {"kind": "export-limit", "path": str(out), "sizes": sizes, "dtype": "bfloat16"},
        rounds,
        lambda: _clear(out),
    ):
        d_export.add(ours["seconds"], limit["seconds"])
    rows.append(d_export)
    _clear(out)
    deflated, stored, raw = root / "bf16-deflate", root / "bf16-none", root / "bf16.raw"
    for ck, compression in ((deflated, "deflate"), (stored, "none")):
        _run(
            {
                "kind": "prepare",
                "path": str(raw),
                "sizes": sizes,
                "targets": [str(ck)],
                "dtype": "bfloat16",
                "compression": compression,
            }
        )
    one_core = Row(
        f"load 256 MiB bf16 (deflate): time / one core inflating it ({os.cpu_count()} cores)",
        "s",
        0.85,
    )
    for ours, limit in _paired(
        {"kind": "load", "path": str(deflated)},
        {"kind": "inflate", "path": str(deflated)},
        rounds,
        lambda: None,
    ):
        one_core.add(ours["seconds"], limit["seconds"])
    rows.append(one_core)
    # The target of issue 35 (1.5x) is for a 16-core machine; on 2 cores inflating
    # cannot keep up with a read from the page cache.
    vs_stored = Row("load 256 MiB bf16: deflate / none (target 1.5 on 16 cores)", "s", None)
    for ours, limit in _paired(
        {"kind": "load", "path": str(deflated)},
        {"kind": "load", "path": str(stored)},
        rounds,
        lambda: None,
    ):
        vs_stored.add(ours["seconds"], limit["seconds"])
    rows.append(vs_stored)
    _clear(deflated, stored, raw)
    return rows


_SECTIONS = ("load", "export", "zip", "small", "bf16")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process pairs per figure")
    parser.add_argument(
        "--big-gib", type=float, default=4.0, help="size of the one-array load (0: skip)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit with status 1 when a target is missed"
    )
    parser.add_argument(
        "--big-rounds",
        type=int,
        default=2,
        help="fresh-process pairs for the one-array load (made even: half in each order)",
    )
    parser.add_argument(
        "--zip-rounds",
        type=int,
        default=8,
        help="fresh-process pairs for zip against directory (made even: half in each order)",
    )
    parser.add_argument(
        "--only",
        default=",".join(_SECTIONS),
        help=f"comma-separated sections to run (default: all of {','.join(_SECTIONS)})",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0

    only = {name.strip() for name in args.only.split(",") if name.strip()}
    if not only or only - set(_SECTIONS):
        parser.error(f"--only takes sections among {','.join(_SECTIONS)}, got {args.only!r}")
    sizes = [TOTAL // N_ARRAYS // 4] * N_ARRAYS
    root = Path(tempfile.mkdtemp(prefix="jaxstruct-bench-"))
    rows: list[Row] = []
    started = time.perf_counter()
    out = root / "out"
    try:
        if "load" in only:
            print("[bench_io] load, 64 arrays", file=sys.stderr, flush=True)
            rows += _load_rows("256 MiB / 64 arrays", sizes, root, args.rounds)
        if "load" in only and args.big_gib > 0:
            print(f"[bench_io] load, one {args.big_gib:g} GiB array", file=sys.stderr, flush=True)
            big = [int(args.big_gib * (1 << 30)) // 4]
            # The first process of a pair was the slower in 7 of 9 pairs (its fresh 4 GiB
            # cost up to 4x as much to fault in): as many pairs in each order.
            big_rounds = args.big_rounds + args.big_rounds % 2
            rows += _load_rows(f"{args.big_gib:g} GiB / 1 array", big, root, big_rounds)

        if "bf16" in only:
            print("[bench_io] bf16 weights", file=sys.stderr, flush=True)
            rows += _bf16_rows([TOTAL // N_ARRAYS // 2] * N_ARRAYS, root, args.rounds)

        if "export" in only:
            print("[bench_io] export", file=sys.stderr, flush=True)
            row = Row("export 256 MiB (auto): time / write + fsync", "s", 1.6)
            for ours, limit in _paired(
                {"kind": "export", "path": str(out), "sizes": sizes},
                {"kind": "export-limit", "path": str(out), "sizes": sizes},
                args.rounds,
                lambda: _clear(out),
            ):
                row.add(ours["seconds"], limit["seconds"])
            rows.append(row)

        if "zip" in only:
            print("[bench_io] zip against directory", file=sys.stderr, flush=True)
            rows += _zip_rows(sizes, root, args.zip_rounds)

        if "small" in only:
            print("[bench_io] small checkpoints", file=sys.stderr, flush=True)
            small = root / "small"
            small.mkdir()
            rates = _run({"kind": "small", "path": str(small), "rounds": max(3, args.rounds)})
            med = {name: statistics.median(v) for name, v in rates.items()}
            floor = ""
            if "floor" in rates:
                ratio = statistics.median(
                    n / f for n, f in zip(rates["numpy"], rates["floor"], strict=True)
                )
                floor = (
                    f", our layout's system calls alone + one device_put {med['floor']:.0f}/s "
                    f"(numpy/floor {ratio:.2f})"
                )
            note = (
                f"(ours {med['ours']:.0f}/s, numpy {med['numpy']:.0f}/s, numpy with temp file + "
                f"fsync + rename + fsync {med['numpy_durable']:.0f}/s, raw write+fsync+read "
                f"{med['raw']:.0f}/s{floor})"
            )
            row = Row(
                f"small checkpoint ({SMALL_ARRAYS} tiny arrays): numpy savez+load cycles/s / ours",
                "/s",
                SMALL_PLAIN_TARGET,
                note=note,
            )
            for o, n in zip(rates["ours"], rates["numpy"], strict=True):
                row.add(o, n, n / o)
            rows.append(row)
            row = Row(
                "small checkpoint, same durability: numpy savez+fsync+rename+load cycles/s / ours",
                "/s",
                SMALL_DURABLE_TARGET,
            )
            for o, n in zip(rates["ours"], rates["numpy_durable"], strict=True):
                row.add(o, n, n / o)
            rows.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    load = os.getloadavg()[0]
    print(
        f"jaxstruct.io: {os.cpu_count()} cores, load average {load:.1f}, "
        f"{args.rounds} fresh-process rounds, {time.perf_counter() - started:.0f} s\n"
    )
    print("| measure | ours | limit | ratio median (min-max) | target | result |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(row.line())
    failed = [r.name for r in rows if not r.ok]
    if failed:
        print(f"\nmissed: {failed}", file=sys.stderr)
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
