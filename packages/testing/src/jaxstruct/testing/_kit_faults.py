"""Faults the plugin kit puts into a format's write: an error half-way, and a killed process.

A fault is a copy of the format under test whose ``write`` hands the real ``write`` an
arrays mapping that fails (or kills the process) when the second array is read: the format
is stopped in the middle of its own work, whatever it does first.
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jaxstruct.io import Format

__all__ = ["FAULT_MESSAGE", "faulty", "in_child", "kill_self", "variant"]

FAULT_MESSAGE = "No space left on device (a fault FormatTests put in the middle of write)"


class _Faulty(Mapping[str, Any]):
    """``arrays`` as ``write`` sees them: reading the second array runs ``fault``."""

    def __init__(self, arrays: Mapping[str, Any], fault: Callable[[], None]) -> None:
        self._arrays = arrays
        self._fault = fault
        self._read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self._read.add(key)
        if len(self._read) >= 2:
            self._fault()
        return self._arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


def variant(fmt: Format, **methods: Callable[..., Any]) -> Format:
    """A copy of ``fmt`` (``copy.copy``) with some of its methods replaced."""
    clone = copy.copy(fmt)
    try:
        for name, method in methods.items():
            setattr(clone, name, method)
    except AttributeError as err:  # __slots__, or a frozen class
        raise TypeError(
            f"FormatTests copies the format (copy.copy) to watch it or put faults into it; "
            f"{type(fmt).__qualname__} does not allow setting methods on a copy ({err})"
        ) from None
    return clone


def faulty(fmt: Format, fault: Callable[[], None], *, after: bool = False) -> Format:
    """A copy of ``fmt`` whose ``write`` runs ``fault`` when the second array is read (or,
    ``after``, once the real ``write`` returned)."""
    real = fmt.write

    def write(target: Any, manifest: bytes, arrays: Mapping[str, Any], **kw: Any) -> None:
        real(target, manifest, arrays if after else _Faulty(arrays, fault), **kw)
        if after:
            fault()

    return variant(fmt, write=write)


def kill_self() -> None:
    """End this process at once, as a power cut or ``kill -9`` would (nothing is cleaned up)."""
    os.kill(os.getpid(), signal.SIGKILL)


def in_child(work: Callable[[], None], timeout: float = 60.0) -> int:
    """Run ``work`` in a forked child; return its wait status as
    ``os.waitstatus_to_exitcode`` gives it (``-9`` when it was killed).

    Raises:
        AssertionError: the child did not end within ``timeout`` seconds (it is killed).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        # JAX warns that fork() and its threads do not mix; the child touches no device.
        warnings.simplefilter("ignore")
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (coverage does not follow it)
        code = 1
        try:
            work()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"an export in a forked child did not end within {timeout} s")
        time.sleep(0.005)
