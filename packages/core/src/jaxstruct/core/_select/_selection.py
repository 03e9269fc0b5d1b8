"""The :class:`Selection` class: its fields and read-only queries, with the mixins' methods."""

from __future__ import annotations

from typing import Any

import jax

from .._fields import field
from .._struct import Struct
from ._edit import Editing
from ._structure import Structural
from ._tree import KeyPath, SelectionError, T

__all__ = ["Selection"]


class Selection(Editing[T], Structural[T], Struct):
    """Some subtrees of a tree, taken out for functional editing; create with :func:`select`.

    Selected subtrees never nest. ``selected`` holds them in tree order with
    their key paths in ``paths``; ``remainder`` is the tree with a
    :class:`SelectionHole` in place of each. A ``Selection`` is itself a
    pytree (its leaves are those of the original tree), so it can cross
    ``jit`` boundaries. ``T`` is the type of the whole tree: rebuilding
    (``apply``, ``set``, ``deselect``, ...) returns a ``T``.

    Attributes:
        remainder: the tree with holes where the selected subtrees were.
        selected: the selected subtrees, in tree order.
        paths: their key paths from the root of the tree.

    Example:
        >>> import jaxstruct.core as js
        >>> tree = {"w": 1.0, "opt": {"lr": 0.1}}
        >>> js.select(tree).at_instances_of(float).count()
        2
        >>> js.select(tree).at(lambda t: t["opt"]["lr"]).set(0.5)
        {'opt': {'lr': 0.5}, 'w': 1.0}
    """

    remainder: Any
    selected: tuple[Any, ...]
    paths: tuple[KeyPath, ...] = field(static=True)

    def count(self) -> int:
        """Return the number of selected subtrees.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, 2, 3]).at_leaves().count()
            3
        """
        return len(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def is_empty(self) -> bool:
        """Return whether nothing is selected.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, 2]).at_instances_of(str).is_empty()
            True
        """
        return not self.paths

    @property
    def selected_by_path(self) -> dict[KeyPath, Any]:
        """The selected subtrees keyed by their key paths, in tree order."""
        return dict(zip(self.paths, self.selected, strict=True))

    def get(self) -> Any:
        """Return the only selected subtree.

        Raises:
            SelectionError: the selection does not hold exactly one subtree.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"a": 1, "b": "x"}).at_instances_of(str).get()
            'x'
        """
        if len(self.paths) != 1:
            raise SelectionError(
                f"Selection.get() needs exactly one selected subtree, got {len(self.paths)}; "
                "use get_sequence() for several, or refine the selection"
            )
        return self.selected[0]

    def get_sequence(self) -> tuple[Any, ...]:
        """Return the selected subtrees, in tree order.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select((1, "a", 2)).at_instances_of(int).get_sequence()
            (1, 2)
        """
        return self.selected

    def get_keypaths(self) -> tuple[KeyPath, ...]:
        """Return the key paths of the selected subtrees, in tree order.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, "a"]).at_instances_of(str).get_keypaths()
            ((SequenceKey(idx=1),),)
        """
        return self.paths

    def __repr__(self) -> str:
        paths = ", ".join(jax.tree_util.keystr(p) or "<root>" for p in self.paths)
        return f"Selection({len(self.paths)} selected: {paths})"
