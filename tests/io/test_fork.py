"""A forked child exports and loads: the parent's worker threads and locks do not follow it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ENV = {**os.environ, "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD": "1"}

# The parent exports (directory, deflated zip, overwrite) and loads 16 MiB, so that
# its worker pool, CRC threads and locks exist; then it forks, and the child runs
# one case. The parent waits for the child at most 60 s, then kills it (status 3).
FORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    import jaxstruct.io as jio

    root, case = sys.argv[1], sys.argv[2]
    big = {"a": np.arange(4 << 20, dtype=np.float32)}  # 16 MiB: CRC checked on threads
    many = {f"m{i}": np.full(1 << 16, i, np.float32) for i in range(8)}  # deflated on the pool

    def run(tag):
        if case == "directory":
            jio.export(many, f"{root}/{tag}-dir")
            assert jio.load(f"{root}/{tag}-dir")["m7"][0] == 7
        elif case == "zip-deflate":
            jio.export(many, f"{root}/{tag}.zip", compression="deflate")
            assert jio.load(f"{root}/{tag}.zip")["m3"][0] == 3
        elif case == "overwrite":
            jio.export(big, f"{root}/shared", overwrite=True, compression="none")
            jio.export(many, f"{root}/shared", overwrite=True)
            assert sorted(os.listdir(root)).count("shared") == 1
        elif case == "load-16MiB":
            back = jio.load(f"{root}/big")
            assert back["a"].nbytes == 16 << 20 and back["a"][-1] == (4 << 20) - 1
        elif case == "non-blocking":
            jio.export(many, f"{root}/{tag}-nb", blocking=False).wait(60)
            assert jio.load(f"{root}/{tag}-nb")["m1"][0] == 1
        else:
            raise ValueError(case)

    jio.export(big, f"{root}/big", compression="none")
    jio.load(f"{root}/big")
    jio.export(many, f"{root}/warm.zip", compression="deflate")
    jio.export(many, f"{root}/warm", overwrite=True)
    jio.export(big, f"{root}/warm", overwrite=True)
    jio.export(many, f"{root}/warm-nb", blocking=False).wait()
    run("parent")

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            run("child")
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            sys.exit(os.waitstatus_to_exitcode(status))
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sys.exit(3)
    """
)


@pytest.mark.parametrize(
    "case", ["directory", "zip-deflate", "overwrite", "load-16MiB", "non-blocking"]
)
def test_forked_child_exports_and_loads(case: str, tmp_path: Path) -> None:
    """After the parent has exported and loaded, a forked child's export or load returns."""
    proc = subprocess.run(
        [sys.executable, "-c", FORKER, str(tmp_path), case],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode != 3, f"the forked child hung in {case!r}"
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_child_forked_while_a_thread_collects_plugins_exports_and_loads(tmp_path: Path) -> None:
    """A thread holds the registry's lock (collecting plugins) when the process forks."""
    script = textwrap.dedent(
        """
        import faulthandler, os, sys, threading, time
        import numpy as np
        import jaxstruct.io as jio
        import jaxstruct.io._plugins as P

        root = sys.argv[1]
        reg = jio.current_registry()
        held, release = threading.Event(), threading.Event()

        def hold():
            with reg._lock, P._registry_lock:
                reg._tables = None
                held.set()
                release.wait()

        t = threading.Thread(target=hold)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            faulthandler.dump_traceback_later(20, exit=True)
            assert {"directory", "zip"} <= set(jio.current_registry().formats)
            jio.export({"w": np.ones(3)}, f"{root}/ck")
            assert jio.load(f"{root}/ck")["w"].sum() == 3
            os._exit(0)
        release.set()
        t.join()
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                sys.exit(os.waitstatus_to_exitcode(status))
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                sys.exit(3)
            time.sleep(0.05)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        check=False,
        env=ENV,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode()
