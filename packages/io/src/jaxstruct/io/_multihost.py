"""Multi-process helpers: who is primary, barriers and shared outcomes, ownership checks."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping
from typing import Any

from jaxstruct.registry import SerializationError

from ._jax_private import distributed_client

__all__ = [
    "BARRIER_TIMEOUT_S",
    "agree",
    "barrier",
    "check_primary_holds",
    "is_primary",
    "process_count",
    "share_outcome",
]

#: How long a process waits for the others at a barrier before giving up.
BARRIER_TIMEOUT_S = 600.0

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


def _client() -> Any:
    """jax.distributed's client (the only barrier with a timeout; JAX keeps it private)."""
    return distributed_client()


def barrier(name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Wait until every process reaches the barrier ``name`` (a no-op with one process).

    Every process must call barriers in the same order: the name gets a
    sequence number, so two exports of the same path never share a barrier.
    """
    if process_count() == 1:
        return
    unique = f"jaxstruct-{name}-{next(_counter)}"
    client = _client()
    if client is None:  # pragma: no cover - JAX moved it
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(unique)
        return
    try:
        client.wait_at_barrier(unique, int(timeout_s * 1000))
    except Exception as err:
        raise SerializationError(
            f"the processes did not all reach barrier {name!r} within {timeout_s:.0f} s "
            f"({type(err).__name__}: {err}); every process must call export()/load() together"
        ) from err


def agree(name: str, value: str, timeout_s: float = BARRIER_TIMEOUT_S) -> str:
    """Return process 0's ``value`` in every process (``value`` itself with one process).

    The others' own ``value`` is ignored. Every process must call it in the
    same order as :func:`barrier`.
    """
    if process_count() == 1:
        return value
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
            f"process 0 did not reach {name!r} within {timeout_s:.0f} s "
            f"({type(err).__name__}: {err}); every process must call export()/load() together"
        ) from err


def share_outcome(
    name: str, error: BaseException | None, timeout_s: float = BARRIER_TIMEOUT_S
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
    unique = f"jaxstruct-{name}-{next(_counter)}"
    client = _client()
    if client is None:  # pragma: no cover - JAX moved it
        barrier(name, timeout_s)
        return
    if is_primary():
        word = "" if error is None else f"{type(error).__name__}\n{error}"
        client.key_value_set(unique, word or "ok")
        return
    try:
        word = client.blocking_key_value_get(unique, int(timeout_s * 1000))
    except Exception as err:
        raise SerializationError(
            f"process 0 did not finish {name!r} within {timeout_s:.0f} s "
            f"({type(err).__name__}: {err}); every process must call export()/load() together"
        ) from err
    if word == "ok":
        return
    kind, _, message = word.partition("\n")
    if kind == "FileExistsError":
        raise FileExistsError(message)
    raise SerializationError(f"process 0 failed at {name!r} ({kind}): {message}")


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
