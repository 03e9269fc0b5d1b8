"""A forked child exports and loads ``.safetensors`` files; the parent goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ENV = {k: v for k, v in os.environ.items() if k != "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD"}

# The parent writes and loads (the CRC threads and pools exist), starts a background
# export, and forks while it is in flight; the child overwrites that same path (it must
# not wait for the parent's write, whose thread it does not have), then writes,
# overwrites and loads its own file. The parent waits for the child at most 30 s, then
# kills it (status 3).
FORKER = textwrap.dedent(
    """
    import os, signal, sys, time, traceback
    import numpy as np
    import jaxstruct.io as jio

    root = sys.argv[1]

    def value(tag, size=4096):
        return {"tag": tag, "w": np.full(size, len(tag), np.float32)}

    def check(path, *tags):
        got = jio.load(path)
        assert got["tag"] in tags and np.all(got["w"] == len(got["tag"])), (path, got)

    jio.export(value("warm"), f"{root}/warm.safetensors")
    check(f"{root}/warm.safetensors", "warm")
    handle = jio.export(value("background", 4 << 20), f"{root}/bg.safetensors",
                        overwrite=True, blocking=False)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            jio.export(value("child"), f"{root}/bg.safetensors", overwrite=True)
            jio.export(value("child"), f"{root}/child.safetensors")
            jio.export(value("child2"), f"{root}/child.safetensors", overwrite=True)
            check(f"{root}/child.safetensors", "child2")
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    in_flight = not handle.done()
    handle.wait(60)
    jio.export(value("after"), f"{root}/warm.safetensors", overwrite=True)
    check(f"{root}/warm.safetensors", "after")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            check(f"{root}/bg.safetensors", "background", "child")
            print(in_flight)
            sys.exit(os.waitstatus_to_exitcode(status))
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sys.exit(3)
    """
)


def test_forked_child_exports_and_loads_safetensors(tmp_path: Path) -> None:
    """Forked while the parent's background export is in flight, a child overwrites that
    path, writes and loads its own file, and exits 0; the parent's exports complete."""
    proc = subprocess.run(
        [sys.executable, "-c", FORKER, str(tmp_path)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 3, "the forked child hung"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "True", "the background export had ended before the fork"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bg.safetensors",
        "child.safetensors",
        "warm.safetensors",
    ]
