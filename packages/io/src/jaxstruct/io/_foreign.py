"""Other libraries' pytree nodes: classes registered with JAX but not with jaxstruct.

equinox Modules, ``flax.struct`` and chex dataclasses register themselves with
``jax.tree_util`` directly. Such a value is stored as its class reference, its
aux (static) data and its children, and rebuilt through the class's own
registered unflatten, exactly as ``jax.tree_util.tree_unflatten`` would.

A stored class is used only when it is vouched for by the target at the same
place, named by ``load_cls``, allowed by ``allow_imports``, or is already a
registered pytree node class of a module this process has imported: its
reference is looked up in ``sys.modules``, never imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["flatten_node", "imported_node_class", "is_node_class", "unflatten_node"]


def flatten_node(value: Any) -> tuple[list[Any], Any] | None:
    """``(children, aux data)`` of a JAX pytree node, or ``None`` for a JAX leaf."""
    import jax

    children, treedef = jax.tree_util.tree_flatten(value, is_leaf=lambda x: x is not value)
    data = treedef.node_data()  # None for a leaf (a node without children is no leaf)
    if data is None:
        return None
    node_type, aux = data
    if node_type is not type(value):
        return None  # a subclass JAX flattens as its registered base: not this class
    return children, aux


def unflatten_node(cls: type, aux: Any, children: Sequence[Any]) -> Any:
    """Rebuild an instance of ``cls`` through its JAX-registered unflatten.

    Raises:
        TypeError: ``cls`` is not registered as a pytree node with JAX, or this
            JAX cannot build a tree from node data.
    """
    import jax

    make = getattr(jax.tree_util.PyTreeDef, "from_node_data_and_children", None)
    if make is None:  # pragma: no cover - every supported JAX has it
        raise TypeError("this JAX version cannot rebuild pytree nodes from their node data")
    leaf = jax.tree_util.tree_structure(0)
    try:
        treedef = make(jax.tree_util.default_registry, (cls, aux), [leaf] * len(children))
    except (ValueError, TypeError, RuntimeError) as err:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} is not registered as a pytree node with "
            f"JAX in this process ({err})"
        ) from None
    return treedef.unflatten(list(children))


def is_node_class(cls: type) -> bool:
    """Whether ``cls`` is registered as a pytree node with JAX (tried with no children)."""
    import jax

    make = getattr(jax.tree_util.PyTreeDef, "from_node_data_and_children", None)
    if make is None:  # pragma: no cover
        return False
    try:
        make(jax.tree_util.default_registry, (cls, None), [])
    except (ValueError, TypeError, RuntimeError):  # RuntimeError: an unregistered type
        return False
    return True


def imported_node_class(ref: str) -> type | None:
    """The JAX pytree node class ``ref`` names in an already imported module, else ``None``.

    Nothing is imported: a module not in ``sys.modules`` gives ``None``.
    """
    module_name, _, qualname = ref.partition(":")
    module = sys.modules.get(module_name)
    if module is None or not qualname or "<" in qualname:
        return None
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if not isinstance(obj, type) or obj.__module__ != module_name:
        return None
    return obj if is_node_class(obj) else None
