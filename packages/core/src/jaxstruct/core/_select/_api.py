"""The entry points: :func:`select` and equinox's one-shot :func:`tree_at`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._locate import locate
from ._selection import Selection
from ._tree import NO_VALUE, SelectionError, SelectionHole, T

__all__ = ["select", "tree_at"]


def select(tree: T) -> Selection[T]:
    """Return a :class:`Selection` holding the whole ``tree``, ready to be refined.

    Works on any pytree: structs, dicts, lists, tuples and registered foreign
    classes. Rebuilding (``apply``, ``set``, ``deselect``, ...) uses each
    class's own unflatten function, which for structs runs no ``__init__``,
    validator, ``__post_init__``, derived field or check (so tracers and holes
    are fine), and a foreign class whose unflatten insists on the type of its
    children may not accept a :class:`SelectionHole` in their place. One
    exception: when ``apply``/``set`` gives a struct *field* a new value as a
    whole, that field's converter runs on it, as ``replace(field=value)``
    would. Untouched subtrees keep their identity.

    Example:
        >>> import jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> class Linear(js.Struct):
        ...     w: object
        ...     b: object
        >>> model = [Linear(w=jnp.ones(2), b=jnp.zeros(2)), Linear(w=jnp.ones(3), b=jnp.zeros(3))]
        >>> new = js.select(model).at_instances_of(Linear).at(lambda l: l.b).set(None)
        >>> new[1]
        Linear(w=Array([1., 1., 1.], dtype=float32), b=None)
    """
    return Selection(SelectionHole(()), (tree,), ((),))


def tree_at(
    where: Callable[[Any], Any],
    tree: T,
    replace: Any = NO_VALUE,
    replace_fn: Callable[[Any], Any] | Any = NO_VALUE,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
    """Return ``tree`` with the node(s) picked by ``where`` replaced (equinox's ``tree_at``).

    ``where(tree)`` returns one node or a tuple of nodes (see
    ``Selection.at``). Give exactly one of ``replace`` (a value; one per
    node, in ``where``'s order, when it returns several) or ``replace_fn``
    (applied to each node). Struct fields replaced as a whole are re-converted
    by their converter; nothing else of the user's runs.

    Args:
        where: the accessor.
        tree: any pytree.
        replace: the new value(s).
        replace_fn: ``old -> new``.
        is_leaf: treat subtrees where this is true as single nodes.

    Raises:
        SelectionError: both or neither of ``replace``/``replace_fn`` given,
            or the number of replacements does not match the nodes.

    Example:
        >>> import jaxstruct.core as js
        >>> class P(js.Struct):
        ...     a: int
        ...     b: int
        >>> js.tree_at(lambda p: p.b, P(a=1, b=2), replace=5)
        P(a=1, b=5)
        >>> js.tree_at(lambda p: (p.a, p.b), P(a=1, b=2), replace_fn=lambda x: -x)
        P(a=-1, b=-2)
    """
    if (replace is NO_VALUE) == (replace_fn is NO_VALUE):
        raise SelectionError("tree_at() takes exactly one of replace= and replace_fn=")
    paths, several = locate(where, tree, is_leaf)
    selection = select(tree).at_keypaths(paths)
    if replace_fn is not NO_VALUE:
        return selection.apply(replace_fn)
    if not several:
        return selection.set(replace)
    values = tuple(replace)
    if len(values) != len(paths):
        raise SelectionError(
            f"tree_at(): where picked {len(paths)} node(s) but replace has {len(values)} "
            "value(s); pass one value per node, in the order where returns them"
        )
    by_path = dict(zip(paths, values, strict=True))
    return selection.apply(lambda p, _: by_path[p], with_keypath=True)
