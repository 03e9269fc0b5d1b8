"""Registration of struct classes with ``flax.serialization`` (an optional peer).

Code ported from ``flax.struct`` often saves its state with
``flax.serialization.to_bytes``/``from_bytes`` or ``to_state_dict``/
``from_state_dict``, which only know the classes in flax's own registry (a
``flax.struct.dataclass`` registers itself there). Every struct class is
registered the way ``flax.struct.dataclass`` registers its classes: the state
dict maps each node field's name to the state dict of its value; static and
opaque fields are not part of it and are kept from the target on restore.

As with optree (see ``_optree``), flax is never imported by us: classes are
registered when they are defined if ``flax.serialization`` is loaded, and all
at once the moment it finishes importing otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from jaxstruct.registry import PytreeSpec, SerializationError, add_registration_listener

from ._lazyimport import when_imported

__all__: list[str] = []

MODULE = "flax.serialization"

_lock = threading.RLock()
#: Struct classes waiting for flax.serialization's import.
_pending: dict[type, PytreeSpec] = {}
#: flax.serialization once it has finished importing (classes defined from then
#: on are registered at once).
_module: ModuleType | None = None


def _path(serialization: ModuleType) -> str:
    current = getattr(serialization, "current_path", None)
    return current() if current is not None else "?"


def _functions(
    serialization: ModuleType, spec: PytreeSpec
) -> tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]:
    cls = spec.cls
    names = tuple(spec.node_fields)

    def to_state_dict(obj: Any) -> dict[str, Any]:
        return {name: serialization.to_state_dict(getattr(obj, name)) for name in names}

    def from_state_dict(obj: Any, state: Any) -> Any:
        where = f"restoring a {cls.__module__}.{cls.__qualname__} at {_path(serialization)!r}"
        if not isinstance(state, Mapping):
            raise SerializationError(
                f"{where}: expected a state dict of its node fields {list(names)}, got "
                f"{type(state).__name__}"
            )
        missing = [name for name in names if name not in state]
        unknown = [str(key) for key in state if key not in names]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"lacks the node field(s) {missing}")
            if unknown:
                parts.append(f"has key(s) {unknown} that are not node fields")
            raise SerializationError(
                f"{where}: the state dict {' and '.join(parts)}; it was written for another "
                f"class or another version of {cls.__qualname__} (node fields: {list(names)})"
            )
        updates = {
            name: serialization.from_state_dict(getattr(obj, name), state[name], name=name)
            for name in names
        }
        return obj.replace(**updates)

    return to_state_dict, from_state_dict


def _register(serialization: ModuleType, spec: PytreeSpec) -> None:
    to_state_dict, from_state_dict = _functions(serialization, spec)
    try:
        serialization.register_serialization_state(spec.cls, to_state_dict, from_state_dict)
    except ValueError:
        # Registered with flax by someone else already: theirs wins, as with JAX.
        return


def _on_spec(spec: PytreeSpec) -> None:
    if spec.kind != "struct":
        return  # foreign pytree types keep whatever flax does with them
    if _module is None:  # the common case (flax not imported): one global read
        with _lock:
            if _module is None:
                _pending[spec.cls] = spec
                return
    assert _module is not None
    _register(_module, spec)


def _on_imported(serialization: ModuleType) -> None:
    """Register every class defined so far, once flax.serialization has fully executed."""
    global _module
    with _lock:
        specs = list(_pending.values())
        _pending.clear()
        _module = serialization
    for spec in specs:
        _register(serialization, spec)


def install() -> None:
    """Start listening (called once when ``jaxstruct.core`` is imported)."""
    when_imported(MODULE, _on_imported)  # at once if flax.serialization is loaded
    add_registration_listener(_on_spec)


install()
