"""One owner of process state (issue 46, item 2): one fork handler, one family of worker
threads, used by io and by its plugins through io's public API."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jaxstruct.io as jio
import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p
    for folder in ("packages", "examples")
    for p in (ROOT / folder).rglob("*.py")
    if ".venv" not in p.parts and "tests" not in p.parts
)


def test_the_project_installs_one_fork_handler() -> None:
    """os.register_at_fork appears once in the project's code: in io, which runs every
    module's reset (plugins' included) from it."""
    calls = [
        str(p.relative_to(ROOT))
        for p in SOURCES
        for _ in re.finditer(r"register_at_fork\(", p.read_text(encoding="utf-8"))
    ]
    assert calls == ["packages/io/src/jaxstruct/io/_process.py"]


def test_plugins_keep_no_threads_of_their_own_for_parallel_work() -> None:
    """jaxstruct-safetensors and jaxstruct-orbax run their parallel work on io's threads."""
    pools = [
        str(p.relative_to(ROOT))
        for p in SOURCES
        if p.parts[-2] in ("safetensors", "orbax") or "plugin_tar" in p.parts
        if "ThreadPoolExecutor" in p.read_text(encoding="utf-8")
    ]
    assert pools == []


FORKER = textwrap.dedent(
    """
    import os, sys, warnings
    import jaxstruct.io as jio

    marker = sys.argv[1]

    @jio.at_fork
    def broken():
        raise RuntimeError("a plugin's bug")

    @jio.at_fork
    def fine():
        with open(marker, "w") as f:
            f.write(str(os.getpid()))

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if open(marker).read() == str(os.getpid()) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


def test_a_plugins_fork_reset_runs_in_the_child_and_a_broken_one_only_warns(
    tmp_path: Path,
) -> None:
    """Resets registered with at_fork run in a forked child, in order; one that raises is
    reported as a warning there and the ones after it still run."""
    marker = tmp_path / "child"
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c", FORKER, str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fork reset" in proc.stderr and "a plugin's bug" in proc.stderr


@pytest.mark.parametrize(
    ("checksums", "prefix"), [(False, "jaxstruct-io_"), (True, "jaxstruct-io-crc_")]
)
def test_submitted_work_runs_on_ios_threads(checksums: bool, prefix: str) -> None:
    """submit_to_workers runs on io's pool, or on its two checksum threads."""
    name = jio.submit_to_workers(lambda: threading.current_thread().name, checksums=checksums)
    assert name.result(10).startswith(prefix)


def test_map_on_workers_yields_in_order_with_a_bounded_number_in_flight() -> None:
    """Results come in the items' order; at most ``ahead`` items are taken beyond the one
    being yielded, whatever the number of items."""
    taken: list[int] = []

    def items() -> object:
        for i in range(40):
            taken.append(i)
            yield i

    out = []
    for result in jio.map_on_workers(lambda i: i * i, items(), ahead=3):
        assert len(taken) - len(out) <= 4
        out.append(result)
    assert out == [i * i for i in range(40)]


def test_map_on_workers_raises_an_items_error_in_its_turn() -> None:
    """An item's error reaches the caller when that item's turn comes, after the ones before."""

    def fn(i: int) -> int:
        if i == 3:
            raise ValueError("item 3")
        return i

    got = []
    with pytest.raises(ValueError, match="item 3"):
        for result in jio.map_on_workers(fn, range(10)):
            got.append(result)
    assert got == [0, 1, 2]
