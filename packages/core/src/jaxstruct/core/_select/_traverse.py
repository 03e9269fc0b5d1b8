"""Refining a selection: the ``at_*`` methods, ``where``, ``pick``, ``refine`` and ``invert``."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Self

import jax
import numpy as np

from ._base import SelectionBase
from ._locate import locate
from ._tree import (
    DESCEND,
    SELECT,
    SKIP,
    KeyPath,
    SelectionError,
    T,
    Trie,
    fill,
    is_leaf,
    split,
    split_at,
)

__all__ = ["Traversal"]


class Traversal(SelectionBase[T]):
    """The methods that narrow a selection down to parts of the selected subtrees."""

    __slots__ = ()

    def _refine(
        self,
        decide: Callable[[KeyPath, Any], int],
        *,
        innermost: bool = False,
        bottom: Callable[[Any], bool] | None = None,
    ) -> Self:
        found: list[tuple[KeyPath, Any]] = []
        splits = [
            (path, split(value, path, (), decide, found, innermost=innermost, bottom=bottom))
            for path, value in zip(self.paths, self.selected, strict=True)
        ]
        return self._make(
            fill(self.remainder, splits),
            tuple(v for _, v in found),
            tuple(p for p, _ in found),
        )

    def _keep(self, keep: Callable[[int, KeyPath, Any], bool]) -> Self:
        kept, back = [], []
        for i, (path, value) in enumerate(zip(self.paths, self.selected, strict=True)):
            (kept if keep(i, path, value) else back).append((path, value))
        remainder = fill(self.remainder, back) if back else self.remainder
        return self._make(remainder, tuple(v for _, v in kept), tuple(p for p, _ in kept))

    def at_subtrees_where(
        self,
        pred: Callable[..., Any],
        *,
        with_keypath: bool = False,
        innermost: bool = False,
    ) -> Self:
        """Select, inside each selected subtree, the subtrees where ``pred`` is true.

        Matches never nest: the outermost match wins (or the innermost, with
        ``innermost=True``). The selected subtree itself is tested too.

        Args:
            pred: ``pred(subtree)``, or ``pred(keypath, subtree)`` with ``with_keypath``
                (the key path relative to the selected subtree); must return a bool.
            with_keypath: pass the relative key path first.
            innermost: prefer the innermost matches over the outermost.

        Raises:
            SelectionError: ``pred`` returned something other than a bool.

        Example:
            >>> import jaxstruct.core as js
            >>> tree = {"a": [1, 2], "b": 3}
            >>> js.select(tree).at_subtrees_where(lambda x: isinstance(x, list)).get()
            [1, 2]
        """

        def decide(rel: KeyPath, node: Any) -> int:
            result = pred(rel, node) if with_keypath else pred(node)
            if not isinstance(result, bool):
                raise SelectionError(
                    f"the predicate must return a bool, got {type(result).__name__} {result!r}; "
                    "wrap array comparisons in bool() or compare shapes instead"
                )
            return SELECT if result else DESCEND

        return self._refine(decide, innermost=innermost)

    def at_instances_of(self, *types: type, innermost: bool = False) -> Self:
        """Select, inside each selected subtree, the subtrees that are instances of ``types``.

        Example:
            >>> import jax.numpy as jnp
            >>> import jaxstruct.core as js
            >>> class Layer(js.Struct):
            ...     w: object
            >>> model = {"enc": Layer(w=jnp.ones(2)), "dec": Layer(w=jnp.ones(3)), "n": 4}
            >>> js.select(model).at_instances_of(Layer).count()
            2
        """
        if not types or not all(isinstance(t, type) for t in types):
            raise TypeError(f"at_instances_of() expected one or more classes, got {types!r}")
        return self.at_subtrees_where(lambda x: isinstance(x, types), innermost=innermost)

    def at_equal_to(self, value: Any) -> Self:
        """Select, inside each selected subtree, the outermost subtrees equal to ``value``.

        Equality is Python's ``==`` (so ``1`` also matches ``1.0`` and
        ``True``); arrays are never compared (their ``==`` is elementwise),
        and a comparison that does not give a bool, or fails (a list holding
        arrays), counts as "not equal" (its children are still looked at).

        Raises:
            SelectionError: ``value`` is an array; use ``at_subtrees_where``
                with your own comparison instead.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"act": "relu", "out": ["relu", "tanh"]}).at_equal_to("relu").count()
            2
        """
        if _is_array(value):
            raise SelectionError(
                f"at_equal_to() cannot look for an array ({type(value).__name__}): arrays "
                "compare elementwise; use at_subtrees_where(lambda x: ...) with your own test"
            )

        def decide(rel: KeyPath, node: Any) -> int:
            if _is_array(node):
                return DESCEND
            try:
                result = node == value
            except (TypeError, ValueError):
                # A container of arrays compared elementwise (``[x] == [1]`` asks
                # for an array's truth value, a TypeError on tracers): undecided,
                # so look inside instead.
                return DESCEND
            if isinstance(result, bool | np.bool_) and bool(result):
                return SELECT
            return DESCEND

        return self._refine(decide)

    def at_leaves(self) -> Self:
        """Select every pytree leaf of each selected subtree (``None`` and empty nodes are not).

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"a": (1, 2), "b": None}).at_leaves().get_sequence()
            (1, 2)
        """
        return self._refine(lambda rel, node: DESCEND, bottom=is_leaf)

    def at_childless(self) -> Self:
        """Select every node without pytree children: the leaves, and ``None``, ``()``, ``[]``,
        ``{}`` and structs with no node fields.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"a": (1, 2), "b": None, "c": []}).at_childless().get_sequence()
            (1, 2, None, [])
        """
        return self._refine(lambda rel, node: DESCEND, bottom=lambda node: True)

    def at_children(self) -> Self:
        """Select the direct pytree children of each selected subtree.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"a": [1, 2], "b": 3}).at_children().get_sequence()
            ([1, 2], 3)
        """
        return self._refine(lambda rel, node: SELECT if len(rel) == 1 else DESCEND)

    def at_keypaths(self, keypaths: Collection[KeyPath]) -> Self:
        """Select the subtrees at ``keypaths``, relative to each selected subtree.

        Paths that do not exist in a subtree select nothing there; when one
        path is a prefix of another, the shorter one wins (selections never nest).

        Example:
            >>> import jax
            >>> import jaxstruct.core as js
            >>> key = (jax.tree_util.DictKey("b"), jax.tree_util.SequenceKey(0))
            >>> js.select({"a": 1, "b": [2, 3]}).at_keypaths([key]).get()
            2
        """
        trie = Trie.build((tuple(p), None) for p in keypaths)

        def decide(rel: KeyPath, node: Any) -> int:
            t: Trie | None = trie
            for key in rel:
                t = t.next.get(key) if t is not None else None
            if t is None:
                return SKIP
            return SELECT if t.here else DESCEND

        return self._refine(decide)

    def at(
        self, accessor: Callable[[Any], Any], *, is_leaf: Callable[[Any], bool] | None = None
    ) -> Self:
        """Select the node(s) ``accessor`` picks out of each selected subtree.

        ``accessor`` must only navigate (attributes, indexing), e.g.
        ``lambda m: m.layers[0].w``; returning a tuple or list of nodes that
        is not itself a node of the tree selects several. It runs on a stand-in
        copy of the subtree whose leaves are placeholders, so it cannot look at
        leaf values. Static and opaque struct fields are not pytree nodes and
        cannot be selected (change them with ``replace``).

        Args:
            accessor: ``subtree -> node`` or ``subtree -> (node, node, ...)``.
            is_leaf: treat subtrees where this is true as single nodes.

        Raises:
            SelectionError: the accessor failed or returned something that is
                not a node of the subtree, or returned nested nodes.

        Example:
            >>> import jaxstruct.core as js
            >>> class Opt(js.Struct):
            ...     lr: float
            ...     name: str = js.field(static=True, default="sgd")
            >>> js.select({"opt": Opt(lr=0.1)}).at(lambda t: t["opt"].lr).set(0.01)
            {'opt': Opt(lr=0.01, name='sgd')}
        """
        located = [locate(accessor, value, is_leaf)[0] for value in self.selected]
        found: list[tuple[KeyPath, Any]] = []
        splits = [
            (path, split_at(value, path, Trie.build((r, None) for r in rel), found))
            for path, value, rel in zip(self.paths, self.selected, located, strict=True)
        ]
        return self._make(
            fill(self.remainder, splits),
            tuple(v for _, v in found),
            tuple(p for p, _ in found),
        )

    def where(self, pred: Callable[..., Any], *, with_keypath: bool = False) -> Self:
        """Keep only the selected subtrees for which ``pred`` is true (the rest go back).

        Args:
            pred: ``pred(subtree)``, or ``pred(keypath, subtree)`` with ``with_keypath``
                (the key path from the root).
            with_keypath: pass the key path first.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, 5, 2]).at_leaves().where(lambda x: x > 1).set(0)
            [1, 0, 0]
        """
        if with_keypath:
            return self._keep(lambda _i, path, value: bool(pred(path, value)))
        return self._keep(lambda _i, _path, value: bool(pred(value)))

    def pick(self, *indices: int) -> Self:
        """Keep only the selected subtrees at ``indices`` in tree order (negative ones count
        from the end); penzai calls this ``pick_nth_selected``.

        Raises:
            SelectionError: no index given, or an index out of range.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, 2, 3, 4]).at_leaves().pick(0, -1).set(0)
            [0, 2, 3, 0]
        """
        count = len(self.paths)
        if not indices:
            raise SelectionError("pick() needs at least one index, e.g. pick(0)")
        wanted = set()
        for i in indices:
            if not isinstance(i, int) or isinstance(i, bool) or not -count <= i < count:
                raise SelectionError(
                    f"pick(): index {i!r} is out of range for {count} selected subtree(s); "
                    f"use an int from {-count} to {count - 1}"
                )
            wanted.add(i % count)
        return self._keep(lambda i, _path, _value: i in wanted)

    def refine(self, selector: Callable[[Any], SelectionBase[Any]]) -> Self:
        """Select, in each selected subtree, what ``selector(subtree)`` selects.

        ``selector`` gets one selected subtree and returns a :class:`Selection`
        of it (usually ``js.select(subtree).at_...(...)``), so each subtree can
        be refined differently; it may also return a selection of a changed
        subtree, which then takes the subtree's place.

        Raises:
            SelectionError: ``selector`` returned something that is not a selection.

        Example:
            >>> import jaxstruct.core as js
            >>> tree = [[1, 2], [3, 4, 5]]
            >>> pick_last = lambda row: js.select(row).at_children().pick(-1)
            >>> js.select(tree).at_children().refine(pick_last).set(0)
            [[1, 0], [3, 4, 0]]
        """
        found: list[tuple[KeyPath, Any]] = []
        splits = []
        for path, value in zip(self.paths, self.selected, strict=True):
            inner = selector(value)
            if not isinstance(inner, SelectionBase):
                raise SelectionError(
                    f"refine(): the selector returned {type(inner).__name__}, not a Selection; "
                    "return js.select(subtree).at_...(...) from it"
                )
            trie = Trie.build((p, None) for p in inner.paths)
            splits.append((path, split_at(inner.deselect(), path, trie, found)))
        return self._make(
            fill(self.remainder, splits),
            tuple(v for _, v in found),
            tuple(p for p, _ in found),
        )

    def invert(self) -> Self:
        """Select the largest subtrees that contain no currently selected subtree.

        Example:
            >>> import jaxstruct.core as js
            >>> tree = {"a": 1, "b": {"c": 2, "d": 3}}
            >>> js.select(tree).at(lambda t: t["b"]["c"]).invert().get_sequence()
            (1, 3)
        """
        chosen = set(self.paths)
        prefixes = {p[:i] for p in self.paths for i in range(len(p))}

        def decide(rel: KeyPath, node: Any) -> int:
            if rel in chosen:
                return SKIP
            return DESCEND if rel in prefixes else SELECT

        return self._fresh(self.deselect())._refine(decide)


def _is_array(value: Any) -> bool:
    """Arrays (NumPy, JAX, tracers): their ``==`` is elementwise, never a bool."""
    return isinstance(value, np.ndarray | jax.Array)
