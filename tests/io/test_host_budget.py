"""One host budget held on every path of an export (issue 45, item 4).

Copies from devices, compressed bytes waiting to be written, the parallel
deflate's inputs, and plugins' reservations all count against
``JAXSTRUCT_HOST_BUDGET``, with several exports running at once in threads.
CPU devices hold their arrays in host memory; ``_host.FORCE_STREAMING`` sends
them down the path arrays on accelerators take.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io import _budget, _host, _pieces
from jaxstruct.registry import SerializationError

from ._minimal import MAGIC, Minimal
from .conftest import assert_same

BUDGET = 4 << 20


class _Copies:
    """The host bytes of device copies alive, at most (each counted until it is gone)."""

    def __init__(self) -> None:
        self.alive = 0
        self.peak = 0
        self.calls = 0
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


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], _Copies]:
    """Device arrays streamed under a 4 MiB budget; what the budget holds, and the copies."""
    monkeypatch.setattr(_host, "FORCE_STREAMING", True)
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, str(BUDGET))
    held: list[int] = []
    lock = threading.Lock()

    def watch(n: int) -> None:
        with lock:
            held.append(n)

    monkeypatch.setattr(_budget, "WATCH", watch)
    copies = _Copies()
    monkeypatch.setattr(_host, "copy_start", copies)
    return held, copies


def _state(seed: int) -> dict[str, Any]:
    """3 MiB split across columns (joined on the host) and 2 MiB of rows: small integers,
    which deflate shrinks to about a quarter (so "auto" deflates them too)."""
    rng = np.random.default_rng(seed)
    mesh = jax.make_mesh((8,), ("a",))
    cols = rng.integers(0, 4, (768, 1024), np.int32)
    rows = rng.integers(0, 4, (2048, 1024), np.uint8)
    return {
        "cols": jax.device_put(cols, NamedSharding(mesh, P(None, "a"))),
        "rows": jax.device_put(rows, NamedSharding(mesh, P("a"))),
    }


def _in_threads(work: list[Any]) -> None:
    errors: list[BaseException] = []

    def run(fn: Any) -> None:
        try:
            fn()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


@pytest.mark.parametrize("suffix", ["", ".zip"])
@pytest.mark.parametrize("compression", ["deflate", "auto", "none"])
@pytest.mark.parametrize("threads", [2, 3])
def test_exports_in_threads_hold_at_most_the_budget(
    tmp_path: Path,
    watched: tuple[list[int], _Copies],
    threads: int,
    compression: str,
    suffix: str,
) -> None:
    """Several exports of device arrays at once: the bytes held in the budget (copies,
    compressed pieces, their inputs) never pass it, the copies alive never either, and
    everything is given back; each checkpoint loads exactly."""
    held, copies = watched
    states = [_state(i) for i in range(threads)]
    paths = [tmp_path / f"ck{i}{suffix}" for i in range(threads)]
    _in_threads(
        [
            lambda s=s, p=p: jio.export(s, p, compression=compression)
            for s, p in zip(states, paths, strict=True)
        ]
    )
    assert copies.calls > 8 * threads  # many pieces per array
    assert max(held) <= BUDGET, max(held)
    assert copies.peak <= BUDGET, copies.peak
    assert held[-1] == 0
    for state, path in zip(states, paths, strict=True):
        assert_same(state, jio.load(path, target=state))


def test_deflated_pieces_of_arrays_in_host_memory_hold_at_most_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NumPy arrays deflated on the pool: their compressed pieces wait to be written within
    the budget (the pieces of a member larger than it are written as they come)."""
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "3M")
    held: list[int] = []
    monkeypatch.setattr(_budget, "WATCH", held.append)
    made: list[int] = []
    deflate = _pieces.deflate_piece

    def spy(*args: Any) -> Any:
        found = deflate(*args)
        made.append(found[2])
        return found

    monkeypatch.setattr(_pieces, "deflate_piece", spy)
    rng = np.random.default_rng(45)
    state = {f"w{i}": rng.integers(0, 256, 3 << 20, np.uint8) for i in range(3)}  # 9 MiB
    path = jio.export(state, tmp_path / "ck.zip", compression="deflate")
    assert sum(made) > 3 << 20  # more compressed bytes than the budget went through the pool
    assert 0 < max(held) <= 3 << 20
    assert held[-1] == 0
    assert_same(state, jio.load(path))


# A fresh process: two threads export 2 x 8 MiB each of device arrays (streamed) under
# an 4 MiB budget, after one export of the same arrays (JAX's and the allocator's first
# costs); the growth of VmHWM during the second. glibc's dynamic mmap threshold is
# fixed (MALLOC_MMAP_THRESHOLD_), so that freed blocks go back to the system and the
# peak measures what the export held rather than what the allocator kept.
GROWTH = textwrap.dedent(
    """
    import os, sys, tempfile, threading
    import numpy as np, jax
    import jaxstruct.io as jio
    from jaxstruct.io import _host

    compression = sys.argv[1]

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    rng = np.random.default_rng(0)
    states = [
        {f"w{k}": jax.device_put(rng.integers(0, 4, 8 << 20, np.uint8)) for k in range(2)}
        for _ in range(2)
    ]
    jax.block_until_ready(states)
    root = tempfile.mkdtemp()
    _host.FORCE_STREAMING = True

    def export_all(tag):
        threads = [
            threading.Thread(
                target=jio.export, args=(s, f"{root}/{tag}{i}"), kwargs={"compression": compression}
            )
            for i, s in enumerate(states)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(os.listdir(root)).count(f"{tag}1") == 1

    export_all("warm")
    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM starts again from VmRSS
    export_all("measured")
    print(status("VmHWM") - base)
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux's VmHWM")
def test_an_export_grows_the_process_by_the_budget_and_5_percent_at_most(tmp_path: Path) -> None:
    """Measured by the system (VmHWM) in a fresh process: two threads exporting 32 MiB of
    device arrays, compressed, under a 4 MiB budget grow it by at most 4 MiB + 5%."""
    env = {
        **os.environ,
        jio.HOST_BUDGET_ENV: str(BUDGET),
        "MALLOC_MMAP_THRESHOLD_": str(128 << 10),
        "TMPDIR": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-c", GROWTH, "deflate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    growth = int(proc.stdout.strip().splitlines()[-1])
    assert growth <= BUDGET + 0.05 * (32 << 20), f"{growth / 2**20:.1f} MiB"


def test_a_reservation_waits_while_others_hold_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """reserve_host blocks while other threads hold the budget, and goes on once they let go."""
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "1M")
    holding, release, waited = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def holder() -> None:
        with jio.reserve_host(768 << 10):
            holding.set()
            release.wait(10)
            order.append("released")

    def second() -> None:
        holding.wait(10)
        waited.set()
        with jio.reserve_host(512 << 10):
            order.append("reserved")

    threads = [threading.Thread(target=holder), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    waited.wait(10)
    threads[1].join(0.3)
    assert threads[1].is_alive() and order == []  # still waiting
    release.set()
    for thread in threads:
        thread.join(10)
    assert order == ["released", "reserved"]


def test_a_reservation_above_the_budget_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More than the whole budget at once can never be held: our error, and the fixes."""
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "1M")
    with pytest.raises(SerializationError, match=r"JAXSTRUCT_HOST_BUDGET.*host_chunks"):
        with jio.reserve_host(2 << 20):
            pass


def test_a_nested_reservation_takes_its_bytes_from_the_enclosing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside a reservation, a nested one (and a stream) takes its part of it, never more of
    the process's budget; more than is free there is refused at once, not waited for."""
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "1M")
    held: list[int] = []
    monkeypatch.setattr(_budget, "WATCH", held.append)
    with jio.reserve_host(512 << 10):
        with jio.reserve_host(256 << 10):
            copied = sum(p.nbytes for p in jio.host_chunks(np.ones((64, 64), order="F")))
            with pytest.raises(SerializationError, match="enclosing reservation"):
                with jio.reserve_host(300 << 10):
                    pass
    assert copied == 64 * 64 * 8
    assert held == [512 << 10, 0]


@pytest.mark.parametrize("kind", ["C", "F", "cols on CPU", "streamed", "scalar", "empty"])
def test_host_chunks_give_an_arrays_bytes_in_c_order(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """host_chunks: the array's bytes in C order, whatever holds them (in place, or copied
    a piece at a time within the budget)."""
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "64K")
    data = np.arange(96 * 128, dtype=np.float32).reshape(96, 128)
    arr: Any = data
    if kind == "F":
        arr = np.asfortranarray(data)
    elif kind == "cols on CPU":
        arr = jax.device_put(data, NamedSharding(jax.make_mesh((8,), ("a",)), P(None, "a")))
    elif kind == "streamed":
        monkeypatch.setattr(_host, "FORCE_STREAMING", True)
        arr = jax.device_put(data, NamedSharding(jax.make_mesh((4, 2), ("a", "b")), P("a", "b")))
    elif kind == "scalar":
        data = np.float32(2.5) * np.ones((), np.float32)
        arr = jnp.asarray(data)
    elif kind == "empty":
        data = np.zeros((0, 3), np.float32)
        arr = jnp.asarray(data)
    pieces = [bytes(p) for p in jio.host_chunks(arr, chunk_bytes=8 << 10)]
    assert b"".join(pieces) == data.tobytes()
    assert all(len(p) <= 8 << 10 for p in pieces)


def test_consecutive_streams_in_one_thread_never_wait_for_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loop that keeps the last piece of one stream while it starts the next, with most of
    the budget held by another thread, goes on: its own piece is not waited for."""
    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "64K")
    monkeypatch.setattr(_host, "FORCE_STREAMING", True)
    arr = jnp.arange(64 << 10, dtype=jnp.uint8)
    want = np.asarray(arr).tobytes()
    holding, release = threading.Event(), threading.Event()

    def other() -> None:
        with jio.reserve_host(40 << 10):
            holding.set()
            release.wait(10)

    got = b""
    for piece in jio.host_chunks(arr):
        got += bytes(piece)  # ``piece`` is still held after the loop
    thread = threading.Thread(target=other)
    thread.start()
    assert holding.wait(10)
    timer = threading.Timer(5, release.set)  # what a thread waiting for itself would need
    timer.start()
    second = b"".join(bytes(p) for p in jio.host_chunks(arr))
    done_before = not release.is_set()
    release.set()
    timer.cancel()
    thread.join(10)
    assert done_before
    assert got == second == want


class _Raw(Minimal):
    """A plugin format with no checksums of its own (jaxstruct sums its arrays at export):
    the docs' minimum, each array's bytes written from ``host_chunks``, within the budget."""

    name = "raw-streamed"
    suffixes = (".raw",)

    def write(self, target: Any, manifest: bytes, arrays: Any, **_: Any) -> None:
        with open(target, "wb") as out:
            out.write(MAGIC + len(manifest).to_bytes(8, "little") + manifest)
            for key in sorted(arrays):
                for piece in jio.host_chunks(arrays[key]):
                    out.write(piece)


def test_the_checksum_pass_of_an_export_holds_at_most_the_budget(
    tmp_path: Path, watched: tuple[list[int], _Copies], monkeypatch: pytest.MonkeyPatch
) -> None:
    """jaxstruct's CRC pass over a plugin's device arrays (12 MiB, each array larger than the
    4 MiB budget) copies them to the host in pieces counted in the budget: the copies alive
    and the bytes held stay within it, every byte is summed, and the checkpoint loads."""
    from jaxstruct.io import _export

    held, copies = watched
    mesh = jax.make_mesh((8,), ("a",))
    rng = np.random.default_rng(46)
    state = {
        "cols": jax.device_put(  # 6 MiB split across columns: joined on the host
            rng.standard_normal((1536, 1024), np.float32), NamedSharding(mesh, P(None, "a"))
        ),
        "rows": jax.device_put(  # 6 MiB of rows
            rng.integers(0, 255, (6144, 1024), np.uint8), NamedSharding(mesh, P("a"))
        ),
    }
    during: dict[str, int] = {}
    checksum_arrays = _export.checksum_arrays

    def pass_alone(arrays: Any, where: str) -> Any:
        held.clear()
        before, copies.peak = copies.calls, copies.alive
        section = checksum_arrays(arrays, where)
        during.update(calls=copies.calls - before, peak=copies.peak, held=max(held, default=0))
        return section

    monkeypatch.setattr(_export, "checksum_arrays", pass_alone)
    with jio.using(_Raw()):
        path = jio.export(state, tmp_path / "ck.raw")
        assert jio.inspect(path).checksums.startswith("CRC-32 of every 1 MiB piece")
        assert_same(state, jio.load(path, target=state))
    assert during["calls"] > 2 * 8  # pieces of each array, not one copy per shard
    assert 0 < during["held"] <= BUDGET, during
    assert during["peak"] <= BUDGET, during
    assert held[-1] == 0


def test_the_checksum_pass_views_arrays_on_cpu_devices_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Arrays already in host memory (CPU devices) are summed where they lie: no copy, no
    part of the budget taken."""
    from jaxstruct.io import _checksums

    copies = _Copies()
    monkeypatch.setattr(_host, "copy_start", copies)
    held: list[int] = []
    monkeypatch.setattr(_budget, "WATCH", held.append)
    arr = jax.device_put(
        np.arange(3 << 20, dtype=np.float32).reshape(3072, 1024),
        NamedSharding(jax.make_mesh((8,), ("a",)), P(None, "a")),
    )
    section = _checksums.checksum_arrays({"a": arr}, "x")
    monkeypatch.setattr(_host, "FORCE_STREAMING", True)
    assert _checksums.checksum_arrays({"a": arr}, "x") == section  # streamed: the same CRCs
    assert copies.calls > 0 and held
    monkeypatch.setattr(_host, "FORCE_STREAMING", False)
    copies.calls, held[:] = 0, []
    assert _checksums.checksum_arrays({"a": arr}, "x") == section
    assert copies.calls == 0 and held == []


@pytest.mark.parametrize("spec", [P("x", None), P(None, "y"), P("x", "y")], ids=str)
def test_a_part_of_a_device_array_streamed_gives_the_crcs_of_the_part_in_place(
    spec: P, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What one process of a multi-process run holds of an array in accelerator memory
    (some of its shards), streamed shard by shard, gives each piece's CRC-32 with the rest
    as zeros, as the same shards in host memory do."""
    from jaxstruct.io import _checksums

    monkeypatch.setenv(jio.HOST_BUDGET_ENV, "1M")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    arr = np.random.default_rng(47).standard_normal((1024, 1536)).astype(np.float32)
    placed = jax.device_put(arr, NamedSharding(mesh, spec))
    dtype, shape = np.dtype(np.float32), arr.shape
    blocks = _checksums._held_blocks(placed)
    part = dict(list(blocks.items())[: max(1, len(blocks) // 2)])
    host = [(box, np.asarray(data)) for box, data in part.items()]
    holders = {"a": _checksums._Holder(host, False)}
    expected = _checksums._host_crcs(holders, {"a": (dtype, shape)}, 1 << 20)["a"]
    streamed = _checksums._streamed_part_crcs("a", part, shape, dtype, 1 << 20)
    assert streamed == expected
    whole = _checksums.checksum_arrays({"a": arr}, "x")["crc32"]["a"]
    assert "".join(f"{c or 0:08x}" for c in streamed) != whole  # a part, not the whole
