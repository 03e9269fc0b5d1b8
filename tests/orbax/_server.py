"""A test server in a child process on 127.0.0.1: a free port, a readiness wait, a stop."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running(
    name: str, argv: Callable[[int], list[str]], ready_path: str, timeout: float
) -> Iterator[str]:
    """Start ``argv(port)`` quiet, wait until ``GET ready_path`` answers (at most ``timeout``
    seconds), yield the server's URL; terminate it afterwards (killed if it lingers)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(argv(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}{ready_path}", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
