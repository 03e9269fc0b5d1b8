"""The floor of the selector classes: the fields as type checkers see them, constructors, deselect.

The selector methods are layered classes, each building only on the ones
below it (see README.md): ``SelectionBase`` <- ``Traversal`` <- ``Editing``
and ``Structural`` <- ``Selection``. A method that returns a selection is
annotated ``Self``, so none of them names the ``Selection`` class on top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Self

from ._tree import KeyPath, SelectionHole, T, fill

__all__ = ["SelectionBase"]


class SelectionBase(Generic[T]):
    """Base of the selector classes; ``T`` is the type of the whole tree."""

    __slots__ = ()

    if TYPE_CHECKING:
        remainder: Any
        selected: tuple[Any, ...]
        paths: tuple[KeyPath, ...]

        def __init__(
            self, remainder: Any, selected: tuple[Any, ...], paths: tuple[KeyPath, ...]
        ) -> None: ...

    def _make(self, remainder: Any, selected: tuple[Any, ...], paths: tuple[KeyPath, ...]) -> Self:
        """A selection of the same tree with other holes."""
        return type(self)(remainder, selected, paths)

    def _fresh(self, tree: Any) -> Self:
        """A selection of the same class holding the whole of ``tree``.

        Typed ``Self``: callers pass a tree of type ``T`` or use the result untyped.
        """
        return type(self)(SelectionHole(()), (tree,), ((),))

    def deselect(self) -> T:
        """Return the tree with the selected subtrees back in place of their holes.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, "a"]).at_instances_of(str).deselect()
            [1, 'a']
        """
        return fill(self.remainder, tuple(zip(self.paths, self.selected, strict=True)))
