"""Every byte of a safetensors file jaxstruct wrote is checked on every read."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import pytest
import safetensors.numpy
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.io._inspect import verify_report
from jaxstruct.registry import SerializationError
from jaxstruct.safetensors import _checksums, _write
from jaxstruct.safetensors._checksums import CHECKSUMS_KEY

from ._older import older

PIECE = 64  # small pieces, so that small tensors span many of them


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checksums, "PIECE_BYTES", PIECE)


def _value() -> dict[str, Any]:
    return {
        "w": np.arange(24 * 10, dtype=np.float32).reshape(24, 10),
        "b": np.arange(7, dtype=np.int16),
        "tag": "model",
    }


def _header(path: Path) -> dict[str, Any]:
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length])


def _mesh() -> Any:
    return jax.make_mesh((4, 2), ("a", "b"))


def _targets() -> list[Any]:
    """Host, and sharded along rows, columns and both (runs that cut pieces)."""
    out: list[Any] = [None]
    for spec in (P("a"), P(None, "b"), P("a", "b")):
        out.append(
            {
                "w": jax.ShapeDtypeStruct(
                    (24, 10), np.float32, sharding=NamedSharding(_mesh(), spec)
                ),
                "b": jax.ShapeDtypeStruct((7,), np.int16),
                "tag": "model",
            }
        )
    return out


def _same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    return (
        got["tag"] == want["tag"]
        and np.array_equal(np.asarray(got["w"]), want["w"])
        and np.array_equal(np.asarray(got["b"]), want["b"])
    )


@pytest.mark.parametrize("writer", ["safetensors", "jaxstruct"])
def test_the_file_records_a_checksum_per_piece_and_one_for_the_header(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both writers record a CRC per piece of each tensor and one of the header; loads pass."""
    if writer == "jaxstruct":
        monkeypatch.setattr(_write, "COPY_BUDGET", 0)
    path = jio.export(_value(), tmp_path / "x.safetensors")
    entry = json.loads(_header(path)["__metadata__"][CHECKSUMS_KEY])
    assert entry["piece"] == PIECE and len(entry["header"]) == 8
    assert len(entry["tensors"]["w"]) == 8 * (24 * 10 * 4 // PIECE)
    for target in _targets():
        assert _same(jio.load(path, target=target), _value())


def test_a_flipped_byte_anywhere_is_found_never_loaded(tmp_path: Path) -> None:
    """A flipped bit at every byte of the file: each load (whole, select=, sharded) either
    fails with our error naming the file, or returns the exact value."""
    path = jio.export(_value(), tmp_path / "x.safetensors")
    blob = path.read_bytes()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(blob)
    targets = _targets()
    silent = []
    fd = os.open(bad, os.O_WRONLY)  # each flip written in place: no truncation (3 ms on ext4)
    for at in range(len(blob)):
        os.pwrite(fd, bytes([blob[at] ^ 0x10]), at)
        if at:
            os.pwrite(fd, blob[at - 1 : at], at - 1)
        for n, target in enumerate([*targets, "select"]):
            try:
                if target == "select":
                    got = jio.load(bad, select=lambda v: v["b"])
                    ok = np.array_equal(got, _value()["b"])
                else:
                    ok = _same(jio.load(bad, target=target), _value())
            except SerializationError as err:
                assert str(bad) in str(err), err
                continue
            if not ok:
                silent.append((at, n))
    os.close(fd)
    assert silent == []


def test_a_sharded_read_checks_the_pieces_it_cuts(tmp_path: Path) -> None:
    """A flip in a column a shard does not read is still found: the pieces its runs cut
    are completed from the file and checked."""
    path = jio.export(_value(), tmp_path / "x.safetensors")
    header = _header(path)
    start = 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
    first, _ = header["w"]["data_offsets"]
    flipped = bytearray(path.read_bytes())
    flipped[start + first + 4 * 9] ^= 1  # row 0, column 9: another shard's column
    path.write_bytes(flipped)
    spec = NamedSharding(jax.make_mesh((8,), ("c",)), P(None, None))
    narrow = {
        "w": jax.ShapeDtypeStruct((24, 10), np.float32, sharding=spec),
        "b": jax.ShapeDtypeStruct((7,), np.int16),
        "tag": "model",
    }
    with pytest.raises(SerializationError, match="does not match its checksum"):
        jio.load(path, target=narrow)
    with pytest.raises(SerializationError, match="tensor 'w' does not match"):
        jio.load(path, target=_targets()[2])


def test_files_without_checksums_still_load(tmp_path: Path) -> None:
    """Another tool's file, and one of an older jaxstruct, load without checks."""
    theirs = tmp_path / "theirs.safetensors"
    safetensors.numpy.save_file({"w": np.ones((2, 3), np.float32)}, str(theirs))
    got = jio.load(theirs, target={"w": np.zeros((2, 3), np.float32)})
    assert got["w"].sum() == 6
    ours = jio.export(_value(), tmp_path / "ours.safetensors")
    header = _header(ours)
    older(header["__metadata__"])
    data = ours.read_bytes()[8 + struct.unpack("<Q", ours.read_bytes()[:8])[0] :]
    text = json.dumps(header).encode()
    earlier = tmp_path / "older.safetensors"
    earlier.write_bytes(struct.pack("<Q", len(text)) + text + data)
    assert _same(jio.load(earlier), _value())
    assert verify_report(earlier) == ([], False)  # "no checksums, a changed byte goes unnoticed"


def test_verify_checks_every_tensor(tmp_path: Path) -> None:
    """verify (``jaxstruct inspect --verify``) reads and checks every tensor."""
    path = jio.export(_value(), tmp_path / "x.safetensors")
    assert verify_report(path) == ([], True)
    flipped = bytearray(path.read_bytes())
    flipped[-3] ^= 1
    path.write_bytes(flipped)
    problems, checked = verify_report(path)
    assert checked and len(problems) == 1 and "does not match its checksum" in problems[0]


def test_racing_overwrites_leave_one_whole_file(tmp_path: Path) -> None:
    """Writers racing to overwrite one path leave one of their files, every byte checked."""
    path = tmp_path / "x.safetensors"
    values = [{"w": np.full((256, 64), i, np.float32), "i": i} for i in range(4)]
    errors: list[BaseException] = []

    def write(value: dict[str, Any]) -> None:
        try:
            for _ in range(5):
                jio.export(value, path, overwrite=True)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(v,)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = jio.load(path)
    assert np.all(got["w"] == got["i"])
    assert verify_report(path) == ([], True)


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import jaxstruct.io as jio
    from jaxstruct.io import _publish
    from jaxstruct.safetensors import _write

    path, step, writer = sys.argv[1], sys.argv[2], sys.argv[3]
    if writer == "jaxstruct":
        _write.COPY_BUDGET = 0
    jio.export({"w": np.full(1 << 16, 1.0), "tag": "old"}, path)
    jio.load(path)  # the CRC threads exist before the fork
    pid = os.fork()
    if pid == 0:
        def hook(name):
            if name == step:
                os.kill(os.getpid(), signal.SIGKILL)
        _publish.STEP_HOOK = hook
        jio.export({"w": np.full(1 << 16, 2.0), "tag": "new"}, path, overwrite=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    got = jio.load(path)
    assert got["tag"] in ("old", "new")
    assert np.all(got["w"] == (1.0 if got["tag"] == "old" else 2.0))
    jio.export({"w": np.full(1 << 16, 3.0), "tag": "next"}, path, overwrite=True)
    assert jio.load(path)["tag"] == "next"
    print(os.WIFSIGNALED(status))
    """
)


@pytest.mark.parametrize("writer", ["safetensors", "jaxstruct"])
@pytest.mark.parametrize("step", ["encoded", "arrays-written", "temp-synced", "published"])
def test_a_forked_writer_killed_at_each_step_keeps_a_loadable_file(
    writer: str, step: str, tmp_path: Path
) -> None:
    """kill -9 of a forked child at each step of an overwrite: the old or the new file loads
    (every byte checked), and the next export replaces it."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, str(tmp_path / "x.safetensors"), step, writer],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "True", f"the child was not killed at {step!r}"
