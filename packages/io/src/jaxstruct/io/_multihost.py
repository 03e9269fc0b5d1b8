"""Several processes: who is primary, barriers and shared outcomes, and preemption notices."""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from jaxstruct.registry import SerializationError

from . import _process
from ._jax_private import distributed_client, distributed_state

#: How long a process waits for the others at a barrier before giving up (by default).
BARRIER_TIMEOUT_S = 600.0
#: The environment variable that sets that wait, in seconds.
SYNC_TIMEOUT_ENV = "JAXSTRUCT_SYNC_TIMEOUT_S"

_counter = itertools.count()


def process_count() -> int:
    """Return the number of JAX processes (1 when JAX is not even imported)."""
    if "jax" not in sys.modules:
        return 1
    import jax

    return jax.process_count()


def _process_index() -> int:
    import jax

    return jax.process_index()


def is_primary() -> bool:
    """Return whether this is process 0 (always true in a single-process run)."""
    return process_count() == 1 or _process_index() == 0


def sync_timeout() -> float:
    """Seconds a process waits for the others (``JAXSTRUCT_SYNC_TIMEOUT_S``, else 600)."""
    text = os.environ.get(SYNC_TIMEOUT_ENV, "").strip()
    if not text:
        return BARRIER_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SerializationError(
            f"{SYNC_TIMEOUT_ENV}={text!r}: expected a positive number of seconds (such as 600)"
        )
    return value


def _where(path: str) -> str:
    return f" for {path}" if path else ""


def _missing(client: Any, prefix: str) -> list[int]:
    """The processes that have not marked their arrival under ``prefix`` (best effort)."""
    try:
        arrived = {int(key.rsplit("/", 1)[-1]) for key, _ in client.key_value_dir_get(prefix)}
    except Exception:  # the coordinator itself may be gone
        return []
    return [i for i in range(process_count()) if i not in arrived]


def _timed_out(
    name: str, path: str, who: str, timeout_s: float, err: Exception
) -> SerializationError:
    return SerializationError(
        f"{name}{_where(path)}: {who} within {timeout_s:g} s (process {_process_index()} "
        f"waited; {type(err).__name__}: {err}). Every process must call export()/load() "
        f"together; {SYNC_TIMEOUT_ENV} sets the wait"
    )


def barrier(name: str, *, path: str = "") -> None:
    """Wait until every process reaches the barrier ``name`` (a no-op with one process)."""
    if process_count() == 1:
        return
    timeout_s = sync_timeout()
    unique = f"jaxstruct-{name}-{next(_counter)}"
    # jax.distributed's client has the only barrier with a timeout; JAX keeps it private.
    client = distributed_client()
    if client is None:  # pragma: no cover - JAX moved it
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(unique)
        return
    try:
        client.key_value_set(f"{unique}/arrived/{_process_index()}", "1")
        client.wait_at_barrier(unique, int(timeout_s * 1000))
    except Exception as err:
        missing = _missing(client, f"{unique}/arrived/")
        who = f"process(es) {missing} did not arrive" if missing else "not every process arrived"
        raise _timed_out(name, path, who, timeout_s, err) from err


def _from_primary(name: str, value: str, path: str, late: str) -> str:
    """Process 0's ``value``, which it publishes and every other process waits for."""
    timeout_s = sync_timeout()
    unique = f"jaxstruct-{name}-{next(_counter)}"
    client = distributed_client()
    if client is None:  # pragma: no cover - JAX moved it
        raise SerializationError(
            f"{name}: jax.distributed's client was not found, so the processes cannot agree"
        )
    if is_primary():
        client.key_value_set(unique, value)
        return value
    try:
        return str(client.blocking_key_value_get(unique, int(timeout_s * 1000)))
    except Exception as err:
        raise _timed_out(name, path, f"process 0 {late}", timeout_s, err) from err


def agree(name: str, value: str, *, path: str = "") -> str:
    """Return process 0's ``value`` in every process (``value`` itself with one process)."""
    return value if process_count() == 1 else _from_primary(name, value, path, "did not arrive")


def gather(name: str, value: Any, *, path: str = "") -> list[Any]:
    """Return every process's JSON-able ``value``, in process order (``[value]`` with one).

    Every process calls it together; one that never comes is named after the timeout.
    """
    if process_count() == 1:
        return [value]
    import json

    timeout_s = sync_timeout()
    unique = f"jaxstruct-{name}-{next(_counter)}"
    client = distributed_client()
    if client is None:  # pragma: no cover - JAX moved it
        raise SerializationError(
            f"{name}: jax.distributed's client was not found, so the processes cannot agree"
        )
    me = _process_index()
    client.key_value_set(f"{unique}/{me}", json.dumps(value))
    out: list[Any] = []
    for index in range(process_count()):
        if index == me:
            out.append(value)
            continue
        try:
            text = client.blocking_key_value_get(f"{unique}/{index}", int(timeout_s * 1000))
        except Exception as err:
            raise _timed_out(name, path, f"process {index} did not arrive", timeout_s, err) from err
        out.append(json.loads(str(text)))
    return out


def share_outcome(name: str, error: BaseException | None, *, path: str = "") -> None:
    """Tell every process how process 0's part of ``name`` ended; raise its failure everywhere."""
    if process_count() == 1:
        return
    if distributed_client() is None:  # pragma: no cover - JAX moved it
        barrier(name, path=path)
        return
    word = "ok" if error is None else f"{type(error).__name__}\n{error}"
    word = _from_primary(name, word, path, "did not finish")
    if word == "ok":
        return
    kind, _, message = word.partition("\n")
    if kind == "FileExistsError":
        raise FileExistsError(message)
    raise SerializationError(f"{name}{_where(path)}: process 0 failed ({kind}): {message}")


def _primary_holds(arr: Any) -> bool:
    """Whether process 0's devices hold every block of ``arr``."""
    blocks = arr.sharding.devices_indices_map(tuple(arr.shape))

    def marker(index: Any) -> tuple[Any, ...]:
        return tuple((s.start, s.stop, s.step) for s in index)

    everywhere = {marker(index) for index in blocks.values()}
    on_primary = {marker(index) for device, index in blocks.items() if device.process_index == 0}
    return everywhere <= on_primary


def check_primary_holds(arrays: Mapping[str, Any], fmt_name: str, where: str) -> None:
    """Refuse arrays that process 0 does not hold entirely (multi-process runs)."""
    import jax

    for key, arr in arrays.items():
        if not isinstance(arr, jax.Array) or _primary_holds(arr):
            continue
        raise SerializationError(
            f"{where}: array {key!r} (shape {tuple(arr.shape)}) is not held entirely by "
            f"process 0, and the {fmt_name!r} format is written by process 0 alone. Use "
            'format="orbax", where every process writes its own shards'
        )


_open: weakref.WeakSet[PreemptionWatch] = weakref.WeakSet()


@_process.at_fork
def _forget_in_child() -> None:
    for watch in list(_open):
        watch._noticed = False


def _distributed() -> Any:
    """jax.distributed's state when it is initialised with several processes, else ``None``."""
    return None if process_count() == 1 else distributed_state()


class PreemptionWatch:
    """Whether a preemption notice arrived, and whether this step is the one to save."""

    def __init__(self, what: str) -> None:
        self._noticed = False
        self._reached = False
        self._pid = os.getpid()
        self._previous: Any = None
        self._installed = False
        state = _distributed()
        self._distributed = state is not None
        if state is not None:
            if getattr(state, "preemption_sync_manager", None) is None:
                raise SerializationError(
                    f"{what}: save_on_preemption=True in a multi-process run needs JAX's "
                    "preemption service, which is off; leave jax_enable_preemption_service "
                    "on (the default) before jax.distributed.initialize()"
                )
            return
        if threading.current_thread() is not threading.main_thread():
            raise SerializationError(
                f"{what}: save_on_preemption=True installs a SIGTERM handler, which Python "
                "allows only in the main thread; create the manager there"
            )
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        _open.add(self)

    def _handle(self, signum: int, frame: Any) -> None:
        previous = self._previous
        child = os.getpid() != self._pid  # a forked child: as if this handler were not there
        if not child:
            self._noticed = True
        if callable(previous):
            previous(signum, frame)
        elif child and previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    @property
    def noticed(self) -> bool:
        """Whether this process received a preemption notice (single process only)."""
        return self._noticed

    @property
    def reached(self) -> bool:
        """Whether :meth:`reached` returned true once: the loop should stop."""
        return self._reached

    def reached_at(self, step: int) -> bool:
        """Return whether ``step`` is the step to save before stopping (then always true)."""
        if self._reached:
            return True
        if self._distributed:
            from jax.experimental import multihost_utils

            self._reached = bool(multihost_utils.reached_preemption_sync_point(step))
        else:
            self._reached = self._noticed
        return self._reached

    def saving(self) -> bool:
        """Called by a save: whether it is the save before stopping (a notice arrived)."""
        if not self._distributed and self._noticed:
            self._reached = True
        return self._reached

    def close(self) -> None:
        """Put back the SIGTERM handler that was replaced (if this watch installed one)."""
        if not self._installed:
            return
        self._installed = False
        _open.discard(self)
        if os.getpid() != self._pid or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._handle:
            # ``None``: the replaced handler was not Python's; the default is all we can restore.
            previous = self._previous if self._previous is not None else signal.SIG_DFL
            signal.signal(signal.SIGTERM, previous)
