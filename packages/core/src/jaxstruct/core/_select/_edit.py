"""Replacing the selected subtrees: ``apply``, ``set`` and their by-path and by-index forms."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Self, overload

import jax

from ._traverse import Traversal
from ._tree import KeyPath, SelectionError, T, reconvert

__all__ = ["Editing"]


def _show(path: KeyPath) -> str:
    return jax.tree_util.keystr(path) or "<root>"


class Editing(Traversal[T]):
    """The methods that give the selected subtrees new values and rebuild the tree."""

    __slots__ = ()

    def _replaced(self, values: Iterable[Any], keep_selected: bool) -> Any:
        updated = self._make(self.remainder, tuple(values), self.paths)
        return updated if keep_selected else updated.deselect()

    @overload
    def apply(
        self,
        fn: Callable[..., Any],
        *,
        with_keypath: bool = False,
        keep_selected: Literal[False] = False,
    ) -> T: ...
    @overload
    def apply(
        self, fn: Callable[..., Any], *, with_keypath: bool = False, keep_selected: Literal[True]
    ) -> Self: ...
    @overload
    def apply(
        self, fn: Callable[..., Any], *, with_keypath: bool = False, keep_selected: bool
    ) -> T | Self: ...
    def apply(
        self, fn: Callable[..., Any], *, with_keypath: bool = False, keep_selected: bool = False
    ) -> T | Self:
        """Replace every selected subtree by ``fn(subtree)`` and rebuild the tree.

        Struct fields replaced as a whole are re-converted by their field's
        converter; nothing else of the user's runs (see :func:`select`).

        Args:
            fn: ``fn(subtree)``, or ``fn(keypath, subtree)`` with ``with_keypath``.
            with_keypath: pass each subtree's key path (from the root) first.
            keep_selected: return the updated :class:`Selection` instead of the tree.

        Returns:
            The rebuilt tree (typed as the tree given to :func:`select`), or the
            updated selection.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"a": 1, "b": "x"}).at_instances_of(int).apply(lambda v: v + 1)
            {'a': 2, 'b': 'x'}
        """
        values = []
        for path, old in zip(self.paths, self.selected, strict=True):
            new = fn(path, old) if with_keypath else fn(old)
            if new is not old:
                new = reconvert(self.remainder, path, new)
            values.append(new)
        return self._replaced(values, keep_selected)

    @overload
    def apply_with_index(
        self, fn: Callable[[int, Any], Any], *, keep_selected: Literal[False] = False
    ) -> T: ...
    @overload
    def apply_with_index(
        self, fn: Callable[[int, Any], Any], *, keep_selected: Literal[True]
    ) -> Self: ...
    def apply_with_index(
        self, fn: Callable[[int, Any], Any], *, keep_selected: bool = False
    ) -> T | Self:
        """Replace the ``i``-th selected subtree (in tree order) by ``fn(i, subtree)``.

        penzai calls this ``apply_with_selected_index``.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select(["a", "b", "c"]).at_leaves().apply_with_index(lambda i, s: s * (i + 1))
            ['a', 'bb', 'ccc']
        """
        index = {path: i for i, path in enumerate(self.paths)}
        return self.apply(
            lambda p, v: fn(index[p], v), with_keypath=True, keep_selected=keep_selected
        )

    @overload
    def set(self, value: Any, *, keep_selected: Literal[False] = False) -> T: ...
    @overload
    def set(self, value: Any, *, keep_selected: Literal[True]) -> Self: ...
    def set(self, value: Any, *, keep_selected: bool = False) -> T | Self:
        """Replace every selected subtree by ``value`` and rebuild the tree.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, "a", 2]).at_instances_of(int).set(0)
            [0, 'a', 0]
        """
        return self.apply(lambda _: value, keep_selected=keep_selected)

    @overload
    def set_sequence(
        self, values: Iterable[Any], *, keep_selected: Literal[False] = False
    ) -> T: ...
    @overload
    def set_sequence(self, values: Iterable[Any], *, keep_selected: Literal[True]) -> Self: ...
    def set_sequence(self, values: Iterable[Any], *, keep_selected: bool = False) -> T | Self:
        """Replace the selected subtrees, in tree order, by ``values``.

        Raises:
            SelectionError: ``values`` does not have one value per selected subtree.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, "a", 2]).at_instances_of(int).set_sequence([10, 20])
            [10, 'a', 20]
        """
        values = tuple(values)
        if len(values) != len(self.paths):
            raise SelectionError(
                f"set_sequence() got {len(values)} value(s) for {len(self.paths)} selected "
                "subtree(s); pass one value per selected subtree"
            )
        by_path = dict(zip(self.paths, values, strict=True))
        return self.apply(lambda p, _: by_path[p], with_keypath=True, keep_selected=keep_selected)

    def set_by_path(self, replacements: Mapping[KeyPath, Any] | Callable[[KeyPath], Any]) -> T:
        """Replace each selected subtree by the value given for its key path (from the root).

        Args:
            replacements: a mapping from key paths to values, with a value for
                every selected path and no other key; or ``path -> value``.

        Raises:
            SelectionError: the mapping misses a selected path or has a key
                that is not one.

        Example:
            >>> import jaxstruct.core as js
            >>> sel = js.select({"a": 1, "b": 2}).at_leaves()
            >>> sel.set_by_path(lambda path: path[0].key * 2)
            {'a': 'aa', 'b': 'bb'}
        """
        if callable(replacements):
            return self.apply(lambda p, _: replacements(p), with_keypath=True)
        table = dict(replacements)
        selected = set(self.paths)
        missing = [p for p in self.paths if p not in table]
        extra = [p for p in table if p not in selected]
        if missing or extra:
            problems = []
            if missing:
                problems.append(f"no value for {', '.join(map(_show, missing))}")
            if extra:
                problems.append(f"{', '.join(map(_show, extra))} is not selected")
            raise SelectionError(
                f"set_by_path(): {'; '.join(problems)}; give one value per path of "
                "get_keypaths() (or pass a function of the path)"
            )
        return self.apply(lambda p, _: table[p], with_keypath=True)

    def set_at_keypaths(self, replacements: Mapping[KeyPath, Any]) -> T:
        """Set the nodes at key paths *relative to each selected subtree* and rebuild.

        The same as ``at_keypaths(paths)`` followed by a set per path; penzai
        calls it ``select_and_set_by_path``.

        Raises:
            SelectionError: a path exists in none of the selected subtrees, or
                one path is a prefix of another.

        Example:
            >>> import jax
            >>> import jaxstruct.core as js
            >>> b0 = (jax.tree_util.DictKey("b"), jax.tree_util.SequenceKey(0))
            >>> js.select({"a": 1, "b": [2, 3]}).set_at_keypaths({b0: 20})
            {'a': 1, 'b': [20, 3]}
        """
        table = {tuple(p): v for p, v in replacements.items()}
        for a in table:
            for b in table:
                if a != b and b[: len(a)] == a:
                    raise SelectionError(
                        f"set_at_keypaths(): {_show(b)} lies inside {_show(a)}; set one of them"
                    )
        used: set[KeyPath] = set()

        def go(prefix: KeyPath, subtree: Any) -> Any:
            inner = self._fresh(subtree).at_keypaths(list(table))
            used.update(inner.paths)
            return inner.set_by_path({p: table[p] for p in inner.paths})

        out = self.apply(go, with_keypath=True)
        unused = [p for p in table if p not in used]
        if unused:
            raise SelectionError(
                f"set_at_keypaths(): {', '.join(map(_show, unused))} exists in none of the "
                f"{len(self.paths)} selected subtree(s); paths are relative to each selected "
                "subtree, check them against at_keypaths() or get_keypaths()"
            )
        return out
