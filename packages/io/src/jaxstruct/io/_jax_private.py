"""Private JAX APIs, the only imports from ``jax._src``: each answers ``None`` once JAX moves it."""

from __future__ import annotations

from typing import Any


def weakly_typed(arr: Any) -> Any:
    """``arr`` as a weakly typed ``jax.Array`` of the same dtype and shape, or ``None``."""
    try:
        from jax._src.lax.lax import _convert_element_type
    except ImportError:  # pragma: no cover - JAX moved it
        return None
    try:
        return _convert_element_type(arr, weak_type=True)
    except (TypeError, ValueError):  # pragma: no cover - JAX changed its signature
        return None


def distributed_state() -> Any:
    """``jax.distributed``'s global state (its preemption sync manager), or ``None``."""
    try:
        from jax._src import distributed

        return distributed.global_state
    except (ImportError, AttributeError):  # pragma: no cover - JAX moved it
        return None


def distributed_client() -> Any:
    """``jax.distributed``'s client (barriers and key-value store with timeouts), or ``None``."""
    return getattr(distributed_state(), "client", None)
