"""What the selector mixins share: the fields as type checkers see them, and constructors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._tree import KeyPath, SelectionHole, T

if TYPE_CHECKING:
    from ._selection import Selection

__all__ = ["SelectionBase"]

U = TypeVar("U")


class SelectionBase(Generic[T]):
    """Base of the :class:`Selection` mixins; ``T`` is the type of the whole tree."""

    __slots__ = ()

    if TYPE_CHECKING:
        remainder: Any
        selected: tuple[Any, ...]
        paths: tuple[KeyPath, ...]

        def __init__(
            self, remainder: Any, selected: tuple[Any, ...], paths: tuple[KeyPath, ...]
        ) -> None: ...

    def _make(
        self, remainder: Any, selected: tuple[Any, ...], paths: tuple[KeyPath, ...]
    ) -> Selection[T]:
        """A selection of the same tree with other holes."""
        return type(self)(remainder, selected, paths)  # type: ignore[return-value]

    def _fresh(self, tree: U) -> Selection[U]:
        """A selection holding the whole of ``tree``."""
        return type(self)(SelectionHole(()), (tree,), ((),))  # type: ignore[return-value]
