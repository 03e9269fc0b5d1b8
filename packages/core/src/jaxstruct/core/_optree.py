"""Registration of every jaxstruct pytree class with optree (an optional dependency).

Design, chosen so that defining a class stays as cheap as before when optree is
not in use:

* A registration listener (``jaxstruct.registry.add_registration_listener``)
  sees every spec: Struct classes, ``register_class`` classes, and classes
  given to ``register_pytree_type`` / ``register_attrs_type``.
* If optree is already imported, the class is registered with it at once.
  Otherwise the listener returns after one ``sys.modules`` lookup, and a
  one-shot import watcher (``_lazyimport``) registers every known class the
  moment ``optree`` finishes importing. So optree is never imported by us, and
  the order of imports does not matter.
* Each class goes into one optree namespace: the class keyword
  ``optree_namespace=`` (inherited by subclasses), else the process-wide
  default set with :func:`set_optree_namespace`, else optree's global registry
  (``""``). optree looks a type up in the requested namespace and then in the
  global registry, so a globally registered class works with
  ``optree.tree_map(f, s)`` and with ``optree.tree_map(f, s, namespace=NS)``
  for every ``NS``. ``None`` opts out of optree registration.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from jaxstruct.registry import PytreeSpec, add_registration_listener, resolve_pytree_spec

from ._errors import StructDefinitionError
from ._lazyimport import when_imported
from ._meta import extension_keywords

__all__ = ["optree_namespace", "set_optree_namespace"]

#: The namespace that stands for optree's global registry in our API (optree's
#: own ``tree_*`` functions use ``""`` the same way).
GLOBAL = ""

_UNSET: Any = object()
_lock = threading.RLock()
_default_namespace: str | None = GLOBAL
#: Classes we registered with optree: class -> (namespace, came from the default).
_registered: dict[type, tuple[str, bool]] = {}
_specs: dict[type, PytreeSpec] = {}


def _check_namespace(value: object, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(
        f"{what} expected a namespace string ('' for optree's global registry) or None "
        f"(do not register with optree), got {type(value).__name__} {value!r}"
    )


def set_optree_namespace(namespace: str | None) -> str | None:
    """Set the optree namespace used for jaxstruct classes that do not choose their own.

    The default is ``""``: optree's global registry, which every optree call
    consults (with or without ``namespace=``). Pass a name to keep jaxstruct
    classes out of the global registry, or ``None`` to skip optree entirely.
    Classes already registered under the previous default move to the new one.
    A class keyword ``optree_namespace=`` overrides this for one class (and
    its subclasses).

    Args:
        namespace: the optree namespace, ``""`` for the global registry, or ``None``.

    Returns:
        The previous default, so a test can restore it.

    Raises:
        TypeError: ``namespace`` is neither a string nor ``None``.

    Example:
        >>> import jaxstruct.core as js
        >>> previous = js.set_optree_namespace("my-project")
        >>> js.set_optree_namespace(previous)
        'my-project'
    """
    global _default_namespace
    namespace = _check_namespace(namespace, "set_optree_namespace()")
    with _lock:
        previous = _default_namespace
        _default_namespace = namespace
        optree = _loaded_optree()
        if optree is not None:
            for cls, (_, from_default) in list(_registered.items()):
                if from_default:
                    _register(optree, _specs[cls])
    return previous


def optree_namespace(cls: type) -> str | None:
    """Return the optree namespace ``cls`` belongs in (``""`` = global, ``None`` = none).

    Example:
        >>> import jaxstruct.core as js
        >>> class Point(js.Struct, optree_namespace="geometry"):
        ...     x: float
        >>> js.optree_namespace(Point)
        'geometry'
    """
    chosen = getattr(cls, "__struct_options__", {}).get("optree_namespace", _UNSET)
    if chosen is _UNSET:
        return _default_namespace
    return chosen


def _loaded_optree() -> Any:
    return sys.modules.get("optree")


def _global_token(optree: Any) -> Any:
    # optree keeps global registration behind a private sentinel on purpose;
    # metaopt/optree#210 asks for a public name. Use it if it ever appears.
    registry = optree.registry
    token = getattr(registry, "GLOBAL_NAMESPACE", None)
    if token is None:
        token = getattr(registry, "__GLOBAL_NAMESPACE")
    return token


def _struct_functions(optree: Any, spec: PytreeSpec) -> tuple[Callable[..., Any], ...]:
    flatten = spec.flatten
    unflatten = spec.unflatten
    entries = spec.node_fields

    def flatten_func(obj: Any) -> tuple[Any, Any, tuple[str, ...]]:
        children, aux = flatten(obj)
        return children, aux, entries

    def unflatten_func(aux: Any, children: Iterable[Any]) -> Any:
        # The generated unflatten caches the children tuple as the flattened
        # form; optree may hand over a list.
        return unflatten(aux, children if type(children) is tuple else tuple(children))

    return flatten_func, unflatten_func, optree.GetAttrEntry


def _foreign_functions(optree: Any, spec: PytreeSpec) -> tuple[Callable[..., Any], ...]:
    cls = spec.cls
    # Look the spec up on every call: re-registering a class with
    # register_pytree_type replaces its functions, as it does for JAX.

    def flatten_func(obj: Any) -> tuple[Any, Any]:
        children, aux = resolve_pytree_spec(cls).flatten(obj)
        return tuple(children), aux

    def unflatten_func(aux: Any, children: Iterable[Any]) -> Any:
        return resolve_pytree_spec(cls).unflatten(aux, tuple(children))

    if spec.kind == "attrs":
        entries = spec.node_fields

        def flatten_attrs(obj: Any) -> tuple[Any, Any, tuple[str, ...]]:
            children, aux = resolve_pytree_spec(cls).flatten(obj)
            return tuple(children), aux, entries

        return flatten_attrs, unflatten_func, optree.GetAttrEntry
    return flatten_func, unflatten_func, optree.AutoEntry


def _register(optree: Any, spec: PytreeSpec) -> None:
    """Register ``spec.cls`` with ``optree`` in its namespace (moving it if that changed)."""
    cls = spec.cls
    with _lock:
        _specs[cls] = spec
        chosen = getattr(cls, "__struct_options__", {}).get("optree_namespace", _UNSET)
        from_default = chosen is _UNSET
        namespace: str | None = _default_namespace if from_default else chosen
        current = _registered.get(cls)
        if current is not None:
            if current[0] == namespace:
                # Already there; foreign functions are looked up per call.
                _registered[cls] = (current[0], from_default)
                return
            old = _global_token(optree) if current[0] == GLOBAL else current[0]
            optree.unregister_pytree_node(cls, namespace=old)
            del _registered[cls]
        if not isinstance(namespace, str):
            return  # None opts out; other values are reported by the keyword check
        if spec.kind == "struct":
            flatten, unflatten, entry = _struct_functions(optree, spec)
        else:
            flatten, unflatten, entry = _foreign_functions(optree, spec)
        token = _global_token(optree) if namespace == GLOBAL else namespace
        try:
            optree.register_pytree_node(
                cls, flatten, unflatten, path_entry_type=entry, namespace=token
            )
        except ValueError:
            # Registered with optree by someone else (or a stale class object
            # from an earlier definition): theirs wins, as with JAX.
            return
        _registered[cls] = (namespace, from_default)


def _on_spec(spec: PytreeSpec) -> None:
    # The hot path of class definition: one dict lookup when optree is absent.
    optree = sys.modules.get("optree")
    if optree is None:
        _specs[spec.cls] = spec
        return
    _register(optree, spec)


def _on_optree_imported(optree: Any) -> None:
    with _lock:
        for spec in list(_specs.values()):
            _register(optree, spec)


def _keyword(cls: type, value: Any) -> None:
    try:
        _check_namespace(value, "optree_namespace=")
    except TypeError as err:
        raise StructDefinitionError(f"{cls.__qualname__}: {err}") from None


def install() -> None:
    """Start listening (called once when ``jaxstruct.core`` is imported)."""
    extension_keywords["optree_namespace"] = _keyword
    if "optree" not in sys.modules:
        when_imported("optree", _on_optree_imported)
    add_registration_listener(_on_spec)


install()
