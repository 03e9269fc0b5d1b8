"""Resource limits applied while reading a checkpoint or a state dict.

Every limit is checked before the memory it guards is allocated, and each has
a keyword of the same name on :func:`jaxstruct.io.load` (and the relevant ones
on :func:`jaxstruct.io.from_state_dict`) to raise it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxstruct.registry import SerializationError

__all__ = ["DEFAULT_LIMITS", "Limits", "limits_from_kwargs"]

MiB = 1 << 20
GiB = 1 << 30


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """The ceilings a reader enforces on an untrusted checkpoint.

    Attributes:
        max_manifest_bytes: size of ``manifest.json`` (default 64 MiB).
        max_depth: nesting depth of the stored value tree (default 100,000).
        max_nodes: number of nodes in the stored value tree (default 10,000,000).
        max_array_bytes: total decoded size of all arrays (default 64 GiB).
        max_inflation_ratio: decoded size over stored size of a compressed
            member (default 1,100; DEFLATE itself cannot exceed about 1,032).
    """

    max_manifest_bytes: int = 64 * MiB
    max_depth: int = 100_000
    max_nodes: int = 10_000_000
    max_array_bytes: int = 64 * GiB
    max_inflation_ratio: int = 1_100


DEFAULT_LIMITS = Limits()
_NAMES = tuple(f.name for f in dataclasses.fields(Limits))


def limits_from_kwargs(function: str, kwargs: dict[str, Any]) -> Limits:
    """Build a :class:`Limits` from keyword arguments, rejecting unknown names and bad values."""
    unknown = sorted(set(kwargs) - set(_NAMES))
    if unknown:
        raise TypeError(
            f"{function}() got unexpected keyword argument(s) {unknown}; "
            f"the limit keywords are {list(_NAMES)}"
        )
    for name, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SerializationError(
                f"{function}(): {name} must be a positive int, got {type(value).__name__} {value!r}"
            )
    return dataclasses.replace(DEFAULT_LIMITS, **kwargs) if kwargs else DEFAULT_LIMITS
