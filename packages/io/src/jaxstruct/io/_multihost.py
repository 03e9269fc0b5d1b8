"""Multi-process helpers: who is primary, barriers and shared outcomes, ownership checks."""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Mapping
from typing import Any

from jaxstruct.registry import SerializationError

from ._jax_private import distributed_client

__all__ = [
    "BARRIER_TIMEOUT_S",
    "SYNC_TIMEOUT_ENV",
    "agree",
    "barrier",
    "check_primary_holds",
    "is_primary",
    "process_count",
    "share_outcome",
    "sync_timeout",
]

#: How long a process waits for the others at a barrier before giving up (by default).
BARRIER_TIMEOUT_S = 600.0
#: The environment variable that sets that wait, in seconds.
SYNC_TIMEOUT_ENV = "JAXSTRUCT_SYNC_TIMEOUT_S"

_counter = itertools.count()


def _jax_loaded() -> bool:
    return "jax" in sys.modules


def process_count() -> int:
    """Return the number of JAX processes (1 when JAX is not even imported)."""
    if not _jax_loaded():
        return 1
    import jax

    return jax.process_count()


def is_primary() -> bool:
    """Return whether this is process 0 (always true in a single-process run)."""
    if process_count() == 1:
        return True
    import jax

    return jax.process_index() == 0


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


def _process_index() -> int:
    import jax

    return jax.process_index()


def _client() -> Any:
    """jax.distributed's client (the only barrier with a timeout; JAX keeps it private)."""
    return distributed_client()


def barrier(name: str, timeout_s: float | None = None, *, path: str = "") -> None:
    """Wait until every process reaches the barrier ``name`` (a no-op with one process).

    Every process must call barriers in the same order: the name gets a
    sequence number, so two exports of the same path never share a barrier.
    After ``timeout_s`` (default :func:`sync_timeout`) it raises, naming the
    barrier, ``path`` and the processes that did not arrive.
    """
    if process_count() == 1:
        return
    timeout_s = sync_timeout() if timeout_s is None else timeout_s
    unique = f"jaxstruct-{name}-{next(_counter)}"
    client = _client()
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
        raise SerializationError(
            f"{name}{_where(path)}: {who} within {timeout_s:g} s (process "
            f"{_process_index()} waited; {type(err).__name__}: {err}). Every process must "
            f"call export()/load() together; {SYNC_TIMEOUT_ENV} sets the wait"
        ) from err


def agree(name: str, value: str, timeout_s: float | None = None, *, path: str = "") -> str:
    """Return process 0's ``value`` in every process (``value`` itself with one process).

    The others' own ``value`` is ignored. Every process must call it in the
    same order as :func:`barrier`.
    """
    if process_count() == 1:
        return value
    timeout_s = sync_timeout() if timeout_s is None else timeout_s
    unique = f"jaxstruct-{name}-{next(_counter)}"
    client = _client()
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
        raise SerializationError(
            f"{name}{_where(path)}: process 0 did not arrive within {timeout_s:g} s (process "
            f"{_process_index()} waited; {type(err).__name__}: {err}). Every process must "
            f"call export()/load() together; {SYNC_TIMEOUT_ENV} sets the wait"
        ) from err


def share_outcome(
    name: str, error: BaseException | None, timeout_s: float | None = None, *, path: str = ""
) -> None:
    """Tell every process how process 0's part of ``name`` ended; raise its failure everywhere.

    Process 0 passes its error (``None`` on success) and returns at once; the
    others wait for that word and raise the same kind of error, so no process
    reports success for a checkpoint that was not written, and none is left
    waiting for a process that gave up (a no-op with one process). Every
    process must call it in the same order as :func:`barrier`.
    """
    if process_count() == 1:
        return
    timeout_s = sync_timeout() if timeout_s is None else timeout_s
    unique = f"jaxstruct-{name}-{next(_counter)}"
    client = _client()
    if client is None:  # pragma: no cover - JAX moved it
        barrier(name, timeout_s, path=path)
        return
    if is_primary():
        word = "" if error is None else f"{type(error).__name__}\n{error}"
        client.key_value_set(unique, word or "ok")
        return
    try:
        word = client.blocking_key_value_get(unique, int(timeout_s * 1000))
    except Exception as err:
        raise SerializationError(
            f"{name}{_where(path)}: process 0 did not finish within {timeout_s:g} s (process "
            f"{_process_index()} waited; {type(err).__name__}: {err}). Every process must "
            f"call export()/load() together; {SYNC_TIMEOUT_ENV} sets the wait"
        ) from err
    if word == "ok":
        return
    kind, _, message = word.partition("\n")
    if kind == "FileExistsError":
        raise FileExistsError(message)
    raise SerializationError(f"{name}{_where(path)}: process 0 failed ({kind}): {message}")


def _primary_holds(arr: Any) -> bool:
    """Whether process 0's devices hold every block of ``arr``.

    Decided from the sharding alone, so every process reaches the same answer
    (``is_fully_addressable`` differs from process to process).
    """
    blocks = arr.sharding.devices_indices_map(tuple(arr.shape))

    def marker(index: Any) -> tuple[Any, ...]:
        return tuple((s.start, s.stop, s.step) for s in index)

    everywhere = {marker(index) for index in blocks.values()}
    on_primary = {marker(index) for device, index in blocks.items() if device.process_index == 0}
    return everywhere <= on_primary


def check_primary_holds(arrays: Mapping[str, Any], fmt_name: str, where: str) -> None:
    """Refuse arrays that process 0 does not hold entirely (multi-process runs).

    Every process reaches the same verdict, so all of them raise together.
    """
    import jax

    for key, arr in arrays.items():
        if not isinstance(arr, jax.Array) or _primary_holds(arr):
            continue
        raise SerializationError(
            f"{where}: array {key!r} (shape {tuple(arr.shape)}) is not held entirely by "
            f"process 0, and the {fmt_name!r} format is written by process 0 alone. Use "
            'format="orbax", where every process writes its own shards'
        )
