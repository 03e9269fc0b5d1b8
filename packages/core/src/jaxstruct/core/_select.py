"""Functional selection and editing of nested pytrees: ``select``, ``Selection``, ``tree_at``.

A :class:`Selection` splits a tree in two: the selected subtrees (in tree
order, with their key paths) and the *remainder*, the tree with every selected
subtree replaced by a childless :class:`SelectionHole`. Refining a selection
(``at_instances_of``, ``at``, ...) looks inside the selected subtrees only;
``apply``/``set`` replace them and ``deselect`` puts them back.

Rebuilding rule: every node is rebuilt with its class's own unflatten
function, which for structs never runs ``__init__``, converters, validators,
``__post_init__``, derived fields or checks (so tracers, holes and sentinels
are fine). One exception: when ``apply``/``set`` gives a struct *field* a new
value (the selected node is the whole field value, and the new value is a
different object), that field's converter runs on it, exactly as
``replace(field=value)`` would; two-argument converters receive the enclosing
struct as it is at that moment. Values changed deeper inside a field (an
element of a list field) are not converted: the field itself was not assigned.
Untouched subtrees keep their identity.

Holes are found by key path, never by type, so a tree that itself contains
``SelectionHole`` or ``Selection`` objects can be selected safely.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

import jax
from jaxstruct.registry import StructError

from ._fields import field
from ._struct import Struct

__all__ = ["Selection", "SelectionError", "SelectionHole", "select", "tree_at"]

KeyPath = tuple[Any, ...]

_SELECT, _DESCEND, _SKIP = 0, 1, 2
_NO_VALUE: Any = object()


class SelectionError(StructError, ValueError):
    """A selection cannot be built, queried or rebuilt as asked."""


class SelectionHole(Struct):
    """A childless placeholder standing where a selected subtree was taken out of the tree.

    It has no pytree children (its ``path`` is static), so JAX sees the
    selected part as removed. You meet holes only when looking at
    ``Selection.remainder``; :func:`select` and its methods create them.

    Attributes:
        path: the key path of the selected subtree, from the root of the tree.

    Example:
        >>> import jax
        >>> import jaxstruct.core as js
        >>> sel = js.select({"a": 1, "b": 2}).at_keypaths([(jax.tree_util.DictKey("a"),)])
        >>> sel.remainder["a"]
        SelectionHole(path=(DictKey(key='a'),))
        >>> jax.tree_util.tree_leaves(sel.remainder)
        [2]
    """

    path: tuple[Any, ...] = field(static=True)


def _children(node: Any) -> tuple[list[tuple[Any, Any]], Any] | None:
    """Flatten exactly one level: ``([(key, child), ...], treedef)``, or ``None`` if childless."""
    keyed, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1:
        return None
    return [(path[0], child) for path, child in keyed], treedef


def _is_leaf(node: Any) -> bool:
    """Whether ``node`` is a JAX leaf (not a container, not ``None``, not an empty node)."""
    treedef = jax.tree_util.tree_structure(node)
    return treedef.num_leaves == 1 and treedef.num_nodes == 1


def _split(
    node: Any,
    path: KeyPath,
    rel: KeyPath,
    decide: Callable[[KeyPath, Any], int],
    found: list[tuple[KeyPath, Any]],
    *,
    innermost: bool = False,
    leaves: bool = False,
) -> Any:
    """Return ``node`` with the chosen subtrees replaced by holes, appending them to ``found``."""
    if not innermost:
        verdict = decide(rel, node)
        if verdict == _SELECT:
            found.append((path, node))
            return SelectionHole(path)
        if verdict == _SKIP:
            return node
    level = _children(node)
    if level is None:
        if (leaves and _is_leaf(node)) or (innermost and decide(rel, node) == _SELECT):
            found.append((path, node))
            return SelectionHole(path)
        return node
    keyed, treedef = level
    before = len(found)
    new = [
        _split(child, (*path, key), (*rel, key), decide, found, innermost=innermost, leaves=leaves)
        for key, child in keyed
    ]
    if len(found) > before:
        return treedef.unflatten(new)
    if innermost and decide(rel, node) == _SELECT:
        found.append((path, node))
        return SelectionHole(path)
    return node


class _Trie:
    """Key paths as a tree of dicts, so a walk only descends where a path continues."""

    __slots__ = ("here", "next", "value")

    def __init__(self) -> None:
        self.next: dict[Any, _Trie] = {}
        self.here = False
        self.value: Any = _NO_VALUE

    @classmethod
    def build(cls, items: Iterable[tuple[KeyPath, Any]]) -> _Trie:
        root = cls()
        for path, value in items:
            t = root
            for key in path:
                t = t.next.setdefault(key, cls())
            t.here = True
            t.value = value
        return root


def _rebuild(
    node: Any, path: KeyPath, trie: _Trie, at: Callable[[Any, KeyPath, _Trie], Any]
) -> Any:
    """Rebuild ``node``, replacing each node at a path that ends in ``trie`` by ``at(...)``."""
    if trie.here:
        return at(node, path, trie)
    level = _children(node)
    if level is None:
        return node
    keyed, treedef = level
    new = []
    for key, child in keyed:
        sub = trie.next.get(key)
        new.append(child if sub is None else _rebuild(child, (*path, key), sub, at))
    return treedef.unflatten(new)


def _fill(node: Any, trie: _Trie) -> Any:
    """Put the values stored in ``trie`` at their paths in ``node`` (the holes)."""
    return _rebuild(node, (), trie, lambda _node, _path, t: t.value)


def _child(node: Any, key: Any) -> Any:
    """Return the child of ``node`` at ``key``."""
    if isinstance(key, jax.tree_util.GetAttrKey) and isinstance(node, Struct):
        return getattr(node, key.name)
    level = _children(node)
    if level is not None:
        for k, child in level[0]:
            if k == key:
                return child
    raise SelectionError(f"no child at key {key!r} in {type(node).__qualname__}")


def _reconvert(remainder: Any, path: KeyPath, value: Any) -> Any:
    """Run the converter of the struct field at ``path``, if it is one (see the module rule)."""
    if not path:
        return value
    key = path[-1]
    if not isinstance(key, jax.tree_util.GetAttrKey):
        return value
    parent = remainder
    for k in path[:-1]:
        parent = _child(parent, k)
    layout = getattr(type(parent), "__struct_layout__", None)
    if layout is None:
        return value
    spec = layout.by_name.get(key.name)
    if spec is None or spec.converter is None:
        return value
    return layout.convert(parent, spec, value)


class Selection(Struct):
    """Some subtrees of a tree, taken out for functional editing; create with :func:`select`.

    Selected subtrees never nest. ``selected`` holds them in tree order with
    their key paths in ``paths``; ``remainder`` is the tree with a
    :class:`SelectionHole` in place of each. A ``Selection`` is itself a
    pytree (its leaves are those of the original tree), so it can cross
    ``jit`` boundaries.

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

    # -- queries ----------------------------------------------------------------------
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

    # -- rebuilding -------------------------------------------------------------------
    def deselect(self) -> Any:
        """Return the tree with the selected subtrees back in place of their holes.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, "a"]).at_instances_of(str).deselect()
            [1, 'a']
        """
        return _fill(self.remainder, _Trie.build(zip(self.paths, self.selected, strict=True)))

    def apply(
        self, fn: Callable[..., Any], *, with_keypath: bool = False, keep_selected: bool = False
    ) -> Any:
        """Replace every selected subtree by ``fn(subtree)`` and rebuild the tree.

        Struct fields replaced as a whole are re-converted by their field's
        converter; nothing else of the user's runs (see the module rule).

        Args:
            fn: ``fn(subtree)``, or ``fn(keypath, subtree)`` with ``with_keypath``.
            with_keypath: pass each subtree's key path (from the root) first.
            keep_selected: return the updated :class:`Selection` instead of the tree.

        Returns:
            The rebuilt tree, or the updated selection.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"a": 1, "b": "x"}).at_instances_of(int).apply(lambda v: v + 1)
            {'a': 2, 'b': 'x'}
        """
        values = []
        for path, old in zip(self.paths, self.selected, strict=True):
            new = fn(path, old) if with_keypath else fn(old)
            if new is not old:
                new = _reconvert(self.remainder, path, new)
            values.append(new)
        updated = Selection(self.remainder, tuple(values), self.paths)
        return updated if keep_selected else updated.deselect()

    def set(self, value: Any, *, keep_selected: bool = False) -> Any:
        """Replace every selected subtree by ``value`` and rebuild the tree.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select([1, "a", 2]).at_instances_of(int).set(0)
            [0, 'a', 0]
        """
        return self.apply(lambda _: value, keep_selected=keep_selected)

    def set_sequence(self, values: Iterable[Any], *, keep_selected: bool = False) -> Any:
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

    # -- refining ---------------------------------------------------------------------
    def _refine(
        self,
        decide: Callable[[KeyPath, Any], int],
        *,
        innermost: bool = False,
        leaves: bool = False,
    ) -> Selection:
        found: list[tuple[KeyPath, Any]] = []
        splits = []
        for path, value in zip(self.paths, self.selected, strict=True):
            splits.append(
                (path, _split(value, path, (), decide, found, innermost=innermost, leaves=leaves))
            )
        remainder = _fill(self.remainder, _Trie.build(splits))
        return Selection(remainder, tuple(v for _, v in found), tuple(p for p, _ in found))

    def at_subtrees_where(
        self,
        pred: Callable[..., Any],
        *,
        with_keypath: bool = False,
        innermost: bool = False,
    ) -> Selection:
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
            return _SELECT if result else _DESCEND

        return self._refine(decide, innermost=innermost)

    def at_instances_of(self, *types: type, innermost: bool = False) -> Selection:
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

    def at_leaves(self) -> Selection:
        """Select every pytree leaf of each selected subtree (``None`` and empty nodes are not).

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"a": (1, 2), "b": None}).at_leaves().get_sequence()
            (1, 2)
        """
        return self._refine(lambda rel, node: _DESCEND, leaves=True)

    def at_children(self) -> Selection:
        """Select the direct pytree children of each selected subtree.

        Example:
            >>> import jaxstruct.core as js
            >>> js.select({"a": [1, 2], "b": 3}).at_children().get_sequence()
            ([1, 2], 3)
        """
        return self._refine(lambda rel, node: _SELECT if len(rel) == 1 else _DESCEND)

    def at_keypaths(self, keypaths: Collection[KeyPath]) -> Selection:
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
        trie = _Trie.build((tuple(p), None) for p in keypaths)

        def decide(rel: KeyPath, node: Any) -> int:
            t: _Trie | None = trie
            for key in rel:
                t = t.next.get(key) if t is not None else None
            if t is None:
                return _SKIP
            return _SELECT if t.here else _DESCEND

        return self._refine(decide)

    def at(
        self, accessor: Callable[[Any], Any], *, is_leaf: Callable[[Any], bool] | None = None
    ) -> Selection:
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
        per_value: dict[KeyPath, list[KeyPath]] = {}
        for path, value in zip(self.paths, self.selected, strict=True):
            rel_paths, _ = _locate(accessor, value, is_leaf)
            per_value[path] = rel_paths
        found: list[tuple[KeyPath, Any]] = []
        splits = []
        for path, value in zip(self.paths, self.selected, strict=True):
            trie = _Trie.build((r, None) for r in per_value[path])
            splits.append((path, _split_at(value, path, trie, found)))
        remainder = _fill(self.remainder, _Trie.build(splits))
        return Selection(remainder, tuple(v for _, v in found), tuple(p for p, _ in found))

    def where(self, pred: Callable[..., Any], *, with_keypath: bool = False) -> Selection:
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
        keep, back = [], []
        for path, value in zip(self.paths, self.selected, strict=True):
            ok = pred(path, value) if with_keypath else pred(value)
            (keep if ok else back).append((path, value))
        remainder = _fill(self.remainder, _Trie.build(back)) if back else self.remainder
        return Selection(remainder, tuple(v for _, v in keep), tuple(p for p, _ in keep))

    def invert(self) -> Selection:
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
                return _SKIP
            return _DESCEND if rel in prefixes else _SELECT

        return select(self.deselect())._refine(decide)

    def __repr__(self) -> str:
        paths = ", ".join(jax.tree_util.keystr(p) or "<root>" for p in self.paths)
        return f"Selection({len(self.paths)} selected: {paths})"


def _split_at(node: Any, path: KeyPath, trie: _Trie, found: list[tuple[KeyPath, Any]]) -> Any:
    """Like :func:`_split` for the exact paths in ``trie`` (whose nodes may be childless)."""

    def hole(node: Any, path: KeyPath, _trie: _Trie) -> Any:
        found.append((path, node))
        return SelectionHole(path)

    return _rebuild(node, path, trie, hole)


class _Probe:
    """Stand-in for a leaf (or childless node) while locating an accessor's target."""

    __slots__ = ("path",)

    def __init__(self, path: KeyPath) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"<node at {jax.tree_util.keystr(self.path) or 'root'}>"


def _probe(
    node: Any,
    path: KeyPath,
    table: dict[int, tuple[Any, KeyPath]],
    is_leaf: Callable[[Any], bool] | None,
) -> Any:
    level = None if is_leaf is not None and is_leaf(node) else _children(node)
    if level is None:
        stand_in: Any = _Probe(path)
    else:
        keyed, treedef = level
        stand_in = treedef.unflatten(
            [_probe(child, (*path, key), table, is_leaf) for key, child in keyed]
        )
    # Keep the object itself in the table so its id cannot be reused meanwhile.
    table[id(stand_in)] = (stand_in, path)
    return stand_in


def _locate(
    accessor: Callable[[Any], Any], tree: Any, is_leaf: Callable[[Any], bool] | None
) -> tuple[list[KeyPath], bool]:
    """Return the relative paths of the nodes ``accessor`` picks, and whether it picked several."""
    table: dict[int, tuple[Any, KeyPath]] = {}
    stand_in = _probe(tree, (), table, is_leaf)
    try:
        result = accessor(stand_in)
    except Exception as err:
        raise SelectionError(
            f"the accessor {getattr(accessor, '__qualname__', accessor)!r} failed on the tree's "
            f"structure ({type(err).__name__}: {err}); it may only navigate with attributes and "
            "indexing, not read leaf values"
        ) from err

    def path_of(obj: Any) -> KeyPath | None:
        entry = table.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None

    single = path_of(result)
    if single is not None:
        return [single], False
    if isinstance(result, tuple | list):
        paths = [path_of(item) for item in result]
        if all(p is not None for p in paths):
            unique = list(dict.fromkeys(p for p in paths if p is not None))
            for a in unique:
                for b in unique:
                    if a != b and b[: len(a)] == a:
                        raise SelectionError(
                            f"the accessor picked {jax.tree_util.keystr(b)} inside "
                            f"{jax.tree_util.keystr(a) or 'the root'}; selected nodes cannot "
                            "nest, pick one of them"
                        )
            return unique, True
    raise SelectionError(
        f"the accessor returned {type(result).__name__} {result!r}, which is not a pytree node "
        "of the tree; static and opaque struct fields are not pytree children (change them "
        "with .replace()), and the accessor must return the node itself, not a copy"
    )


def select(tree: Any) -> Selection:
    """Return a :class:`Selection` holding the whole ``tree``, ready to be refined.

    Works on any pytree: structs, dicts, lists, tuples and registered foreign
    classes. Rebuilding uses each class's unflatten function, so a foreign
    class whose unflatten insists on the type of its children may not accept a
    :class:`SelectionHole` in their place.

    Example:
        >>> import jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> class Linear(js.Struct):
        ...     w: object
        ...     b: object
        >>> model = [Linear(w=jnp.ones(2), b=jnp.zeros(2)), Linear(w=jnp.ones(3), b=jnp.zeros(3))]
        >>> new = js.select(model).at_instances_of(Linear).at(lambda l: l.b).set(None)
        >>> new[1]
        Linear(w=float32[3], b=None)
    """
    return Selection(SelectionHole(()), (tree,), ((),))


def tree_at(
    where: Callable[[Any], Any],
    tree: Any,
    replace: Any = _NO_VALUE,
    replace_fn: Callable[[Any], Any] | Any = _NO_VALUE,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Return ``tree`` with the node(s) picked by ``where`` replaced (equinox's ``tree_at``).

    ``where(tree)`` returns one node or a tuple of nodes (see
    :meth:`Selection.at`). Give exactly one of ``replace`` (a value; one per
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
    if (replace is _NO_VALUE) == (replace_fn is _NO_VALUE):
        raise SelectionError("tree_at() takes exactly one of replace= and replace_fn=")
    paths, several = _locate(where, tree, is_leaf)
    selection = select(tree).at_keypaths(paths)
    if replace_fn is not _NO_VALUE:
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
