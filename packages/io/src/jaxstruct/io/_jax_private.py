"""Private JAX APIs, the only imports from ``jax._src``: each answers ``None`` once JAX moves it."""

from __future__ import annotations

import functools
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


@functools.cache
def _batched_put() -> tuple[Any, Any, Any] | None:
    """XLA's batched put, JAX's default device getter and ``ShapedArray``, or ``None``."""
    try:
        from jax._src.core import ShapedArray
        from jax._src.interpreters.pxla import get_default_device
        from jax._src.lib import xla_client  # pyright: ignore[reportPrivateImportUsage]

        return xla_client.batched_device_put, get_default_device, ShapedArray
    except (ImportError, AttributeError):  # JAX moved them
        return None


@functools.lru_cache(maxsize=64)
def _single_device(device: Any) -> Any:
    """One sharding object per device, so that XLA's form of it is computed once."""
    import jax

    return jax.sharding.SingleDeviceSharding(device)


def put_on_default_device(arrays: list[Any]) -> list[Any] | None:
    """Host arrays as ``jax.device_put(arrays)`` gives them (uncommitted, on the default
    device, aligned data adopted without a copy), or ``None``.

    XLA's batched put, one call per array, without ``jax.device_put``'s dispatch: ten
    tiny arrays take a third of the time. Only arrays ``jax.device_put`` would store as
    they are (no dtype canonicalised away) are given; the caller checks that.
    """
    found = _batched_put()
    if found is None:
        return None
    put, get_default_device, shaped_array = found
    try:
        device = get_default_device()  # jax.default_device(...) and the config
    except (TypeError, AttributeError):  # pragma: no cover - JAX changed it
        return None
    sharding, devices = _single_device(device), [device]
    avals: dict[tuple[Any, ...], Any] = {}  # arrays of a model share a few shapes
    out = []
    try:
        for x in arrays:
            aval = avals.get((x.shape, x.dtype))
            if aval is None:
                aval = avals[x.shape, x.dtype] = shaped_array(x.shape, x.dtype)
            out.append(put(aval, sharding, [x], devices, False))
    except (TypeError, AttributeError):  # pragma: no cover - JAX changed its signature
        return None
    return out
