"""The private JAX APIs the io package uses, each behind one guarded function.

JAX gives no public way to make a weakly typed array with a shape, nor a
barrier with a timeout, nor to ask whether its preemption service runs; all
live under ``jax._src`` and may move in any release. Everything the package
needs from there is imported here and only here, and each function answers
``None`` when JAX no longer has it, so that the callers take their public
fallback (tested with the locked JAX and the
floor, JAX 0.7.1).
"""

from __future__ import annotations

from typing import Any

__all__ = ["distributed_client", "distributed_state", "weakly_typed"]


def weakly_typed(arr: Any) -> Any:
    """``arr`` as a weakly typed ``jax.Array`` of the same dtype and shape, or ``None``.

    ``None`` when JAX's private ``_convert_element_type`` is gone or refuses.
    """
    try:
        from jax._src.lax.lax import _convert_element_type
    except ImportError:  # pragma: no cover - JAX moved it
        return None
    try:
        return _convert_element_type(arr, weak_type=True)
    except (TypeError, ValueError):  # pragma: no cover - JAX changed its signature
        return None


def distributed_client() -> Any:
    """``jax.distributed``'s client (barriers and key-value store with timeouts), or ``None``.

    ``None`` when JAX keeps it elsewhere, or before ``jax.distributed.initialize``.
    """
    try:
        from jax._src import distributed

        return distributed.global_state.client
    except (ImportError, AttributeError):  # pragma: no cover - JAX moved it
        return None


def distributed_state() -> Any:
    """``jax.distributed``'s global state (its preemption sync manager), or ``None``.

    ``None`` when JAX keeps it elsewhere.
    """
    try:
        from jax._src import distributed

        return distributed.global_state
    except (ImportError, AttributeError):  # pragma: no cover - JAX moved it
        return None
