"""Checkpoints without a jaxstruct manifest: tensors matched to a target's leaves by tree path."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

from ._contract import read_checked
from ._formats import ArraySpec, Format, OpenedCheckpoint
from ._nodes import escape_step

#: ``rename=``: stored tensor name -> leaf name (a missing name is kept), or a function
#: returning the leaf name, or ``None`` to ignore that tensor.
Rename = Mapping[str, str] | Callable[[str], "str | None"]

_SHOWN = 20  # names listed in an error, per kind


def join_path(steps: Iterable[object]) -> str:
    """The name of a tree path: its steps joined by ``.``, each escaped (``%`` as ``%25``,
    ``.`` as ``%2E``, ``/`` as ``%2F``), so a dict key ``"a.b"`` and the nested keys
    ``"a"``, ``"b"`` get different names (``a%2Eb`` and ``a.b``).

    Example:
        >>> join_path(["params", "layers", 0, "w"]), join_path(["v1.2/x"])
        ('params.layers.0.w', 'v1%2E2%2Fx')
    """
    return ".".join(escape_step(str(step)) for step in steps)


def _key_step(entry: Any) -> object:
    """The step of one ``jax.tree_util`` key entry: dict key, index or attribute name."""
    for attr in ("key", "idx", "name"):  # DictKey / FlattenedIndexKey, SequenceKey, GetAttrKey
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)  # pragma: no cover - a key type JAX may add later


def _renamer(rename: Rename | None, where: str) -> Callable[[str], str | None]:
    if rename is None:
        return lambda name: name
    if isinstance(rename, Mapping):
        table = dict(rename)
        bad = [k for k, v in table.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise TypeError(f"rename= must map tensor names to leaf names (str), got {bad[:3]}")
        return lambda name: table.get(name, name)
    if callable(rename):

        def call(name: str) -> str | None:
            try:
                new = rename(name)
            except Exception as err:
                raise SerializationError(
                    f"{where}: rename= failed on the tensor {name!r} ({type(err).__name__}: {err})"
                ) from err
            if new is not None and not isinstance(new, str):
                raise SerializationError(
                    f"{where}: rename= must return a leaf name (str) or None, got {new!r} for "
                    f"the tensor {name!r}"
                )
            return new

        return call
    raise TypeError(f"rename= expected a mapping or a function, got {rename!r}")


def _listing(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _picked_leaves(select: Callable[[Any], Any], treedef: Any, count: int, where: str) -> set[int]:
    """The indices of the target leaves inside the part ``select`` picks."""
    import jax

    markers = [jax.ShapeDtypeStruct((i,), np.uint8) for i in range(count)]
    stand_in = jax.tree_util.tree_unflatten(treedef, markers)
    try:
        picked = select(stand_in)
    except Exception as err:
        raise SerializationError(
            f"{where}: select={getattr(select, '__qualname__', select)!r} failed on the target "
            f"({type(err).__name__}: {err})"
        ) from err
    by_id = {id(m): i for i, m in enumerate(markers)}
    leaves = jax.tree_util.tree_leaves(picked, is_leaf=lambda x: id(x) in by_id)
    return {by_id[id(leaf)] for leaf in leaves if id(leaf) in by_id}


def load_plain(
    fmt: Format,
    opened: OpenedCheckpoint,
    *,
    target: Any,
    rename: Rename | None,
    select: Callable[[Any], Any] | None,
    where: str,
) -> Any:
    """Fill ``target``'s array leaves with the tensors of a checkpoint without a manifest."""
    if target is None:
        if getattr(opened, "loads_flat", False) is True:
            return _load_flat(fmt, opened, rename=rename, select=select, where=where)
        raise SerializationError(
            f"{where}: this {fmt.name} checkpoint has no jaxstruct manifest (another tool wrote "
            "it), so it says nothing about classes; pass target= a value of the structure to "
            "fill (a struct of arrays or jax.ShapeDtypeStruct leaves), with rename= for tensor "
            "names that differ from the target's tree paths (jaxstruct inspect PATH lists them)"
        )
    import jax

    tensors = opened.tensors()
    rename_one = _renamer(rename, where)
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    leaf_of: dict[str, int] = {}
    for i, (path, leaf) in enumerate(flat):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            leaf_of[join_path(_key_step(e) for e in path)] = i
    wanted_leaves = set(leaf_of.values())
    if select is not None:
        wanted_leaves &= _picked_leaves(select, treedef, len(flat), where)
    tensor_of: dict[int, str] = {}
    unmatched: list[str] = []
    for name in tensors:
        new = rename_one(name)
        if new is None:
            continue
        index = leaf_of.get(new)
        if index is None:
            unmatched.append(name if new == name else f"{name} (renamed {new})")
            continue
        if index in tensor_of:
            raise SerializationError(
                f"{where}: the tensors {tensor_of[index]!r} and {name!r} both name the leaf "
                f"{new!r}; fix rename="
            )
        tensor_of[index] = name
    missing = [n for n, i in leaf_of.items() if i in wanted_leaves and i not in tensor_of]
    if missing or (unmatched and select is None):
        parts = []
        if missing:
            parts.append(f"target leaves with no tensor: {_listing(missing)}")
        if unmatched and select is None:
            parts.append(f"tensors matching no target leaf: {_listing(unmatched)}")
        raise SerializationError(
            f"{where}: the file's tensors and the target's leaves do not match by tree path ("
            + "; ".join(parts)
            + "). Map tensor names to leaf names with rename= (a dict, or a function returning "
            "the leaf name, or None to ignore a tensor)"
        )
    wanted: dict[str, Any] = {}
    for index in sorted(wanted_leaves):
        name, leaf = tensor_of[index], flat[index][1]
        spec: ArraySpec = tensors[name]
        try:
            dtype = np.dtype(leaf.dtype)
        except TypeError:
            dtype = None
        if dtype != spec.dtype or tuple(leaf.shape) != tuple(spec.shape):
            leaf_name = next(n for n, i in leaf_of.items() if i == index)
            raise SerializationError(
                f"{where}: the tensor {name!r} is {spec.dtype} {tuple(spec.shape)}, but the "
                f"target leaf {leaf_name!r} is {leaf.dtype} {tuple(leaf.shape)}"
            )
        wanted[name] = None if isinstance(leaf, np.ndarray) else getattr(leaf, "sharding", None)
    table = {name: tensors[name] for name in wanted}
    arrays = read_checked(fmt, opened, table, wanted, where)
    leaves = [
        arrays[tensor_of[i]] if i in wanted_leaves else leaf for i, (_, leaf) in enumerate(flat)
    ]
    value = jax.tree_util.tree_unflatten(treedef, leaves)
    return value if select is None else select(value)


def _load_flat(
    fmt: Format,
    opened: OpenedCheckpoint,
    *,
    rename: Rename | None,
    select: Callable[[Any], Any] | None,
    where: str,
) -> Any:
    """The tensors of a file without a manifest that holds nothing else, as a dict
    ``{name: NumPy array}`` in the file's order (``rename=`` renames or drops names;
    ``select=`` picks from that dict, and only what it picks is read)."""
    tensors = opened.tensors()
    rename_one = _renamer(rename, where)
    named: dict[str, str] = {}  # the dict's key -> the tensor's name
    for name in tensors:
        new = rename_one(name)
        if new is None:
            continue
        if new in named:
            raise SerializationError(
                f"{where}: the tensors {named[new]!r} and {name!r} both get the name {new!r}; "
                "fix rename="
            )
        named[new] = name
    wanted = set(named)
    stand_in: dict[str, Any] = {}
    if select is not None:
        import jax

        stand_in = {
            key: jax.ShapeDtypeStruct(tensors[name].shape, tensors[name].dtype)
            for key, name in named.items()
        }
        flat, treedef = jax.tree_util.tree_flatten_with_path(stand_in)
        picked = _picked_leaves(select, treedef, len(flat), where)
        wanted = {_key_step(path[0]) for i, (path, _) in enumerate(flat) if i in picked}
    table = {named[key]: tensors[named[key]] for key in named if key in wanted}
    arrays = read_checked(fmt, opened, table, dict.fromkeys(table), where)
    value = {key: arrays[name] if key in wanted else stand_in[key] for key, name in named.items()}
    return value if select is None else select(value)
