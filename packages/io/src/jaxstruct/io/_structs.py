"""The few things ``jaxstruct.io`` needs from ``jaxstruct.core``, imported lazily.

``jaxstruct.core`` imports this package lazily from its ``Struct`` methods, so
importing core at module level here would be circular at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["build_struct", "is_struct_class", "struct_fields"]


def is_struct_class(cls: type) -> bool:
    """Whether ``cls`` is a Struct class (registered as one; core is not imported)."""
    from jaxstruct.registry import is_registered_pytree_type, resolve_pytree_spec

    return is_registered_pytree_type(cls) and resolve_pytree_spec(cls).kind == "struct"


def struct_fields(cls: type) -> list[Any]:
    """Return the ``FieldSpec`` objects of a Struct class, in declaration order."""
    import jaxstruct.core as js

    return list(js.fields(cls).values())


def build_struct(cls: type, values: Mapping[str, Any]) -> Any:
    """Build an instance of ``cls`` from field values without running ``__init__``."""
    import jaxstruct.core as js

    return js.build(cls, values)
