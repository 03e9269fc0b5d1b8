"""Support for a user-written ``__init__`` that assigns ``self.x = ...``.

The instance stays mutable while the user's ``__init__`` runs (assignments go
through the field's converter); afterwards the rest of the lifecycle runs and
the instance is frozen. Nested calls (``super().__init__``) share one build.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ._lifecycle import building, finish

__all__ = ["wrap_user_init"]

_osa = object.__setattr__


def wrap_user_init(fn: Callable[..., None]) -> Callable[..., None]:
    """Wrap a class-body ``__init__`` so it can assign fields before the instance freezes."""
    if getattr(fn, "_jaxstruct_user_init", False):
        return fn

    @functools.wraps(fn)
    def __init__(self: Any, /, *args: Any, **kwargs: Any) -> None:
        ids = building()
        key = id(self)
        if key in ids:
            fn(self, *args, **kwargs)
            return
        layout = type(self).__struct_layout__
        ids.add(key)
        try:
            for spec in layout.fields:
                if spec.derived is None and spec.has_default:
                    _osa(self, spec.name, spec.make_default())
            fn(self, *args, **kwargs)
            # A class's own __init__ takes no InitVars: __post_init__ gets their defaults.
            finish(self, layout, initvars=tuple(_default(v) for v in layout.initvars))
        finally:
            ids.discard(key)

    __init__._jaxstruct_user_init = True  # type: ignore[attr-defined]
    return __init__


def _default(spec: Any) -> Any:
    return spec.make_default() if spec.has_default else None
