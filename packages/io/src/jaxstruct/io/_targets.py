"""Restore targets matched to the stored arrays; shardings saved and put back on a mesh."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
from jaxstruct.registry import ClassReferenceError, SerializationError, class_ref

from ._formats import ArraySpec, Placement
from ._nodes import (
    ARRAY_TAGS,
    CALLABLE,
    CLASS,
    CLASS_TAGS,
    DICT,
    FROZENSET,
    LIST,
    NAMEDTUPLE,
    NOT_A_KEY,
    PRNGKEY,
    PYTREE,
    SET,
    STRUCT,
    TUPLE,
    MalformedNode,
    child_names,
    children,
    error_step,
    key_value,
)
from ._values import flatten_named, is_struct_class

#: One entry of a PartitionSpec: no axis, one mesh axis, or several.
SpecEntry = None | str | tuple[str, ...]


class SavedSharding(NamedTuple):
    """How one array was sharded when saved.

    Attributes:
        spec: the ``PartitionSpec`` entries, one per leading dimension.
        mesh: ``(axis name, size)`` of each axis of the mesh it lay on.
    """

    spec: tuple[SpecEntry, ...]
    mesh: tuple[tuple[str, int], ...]


def saved_sharding(arr: Any) -> SavedSharding | None:
    """Return how ``arr`` is sharded, or ``None`` (NumPy, or not a ``NamedSharding``).

    ``None`` is stored for arrays that lie whole on one device or on the host;
    ``load(mesh=)`` replicates them.
    """
    if "jax" not in sys.modules:
        return None
    import jax

    sharding = getattr(arr, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    spec: list[SpecEntry] = []
    for entry in sharding.spec:
        if entry is None or entry is jax.sharding.PartitionSpec.UNCONSTRAINED:
            spec.append(None)
        elif isinstance(entry, str):
            spec.append(entry)
        else:
            spec.append(tuple(str(name) for name in entry))
    mesh = tuple((str(name), int(size)) for name, size in sharding.mesh.shape.items())
    return SavedSharding(tuple(spec), mesh)


def mesh_placements(
    saved: Mapping[str, SavedSharding | None] | None,
    keys: Iterable[str],
    mesh: Any,
    *,
    strict: bool,
    where: str,
) -> dict[str, Any]:
    """A ``NamedSharding`` on ``mesh`` for each of ``keys``, from the shardings saved."""
    import jax

    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"load(): mesh expected a jax.sharding.Mesh, got {mesh!r}")
    if saved is None:
        raise SerializationError(
            f"{where}: this checkpoint does not record how its arrays were sharded (the "
            "built-in formats never do; the 'orbax' format does from jaxstruct-orbax 0.1.0), "
            "so load(mesh=) cannot place them. Pass target= (jax.eval_shape of the value, "
            "with shardings) instead, or load without mesh= and jax.device_put the result"
        )
    mesh_axes = set(mesh.axis_names)
    out = {}
    for key in keys:
        record = saved.get(key)
        entries: list[SpecEntry] = []
        for entry in record.spec if record is not None else ():
            names = (entry,) if isinstance(entry, str) else entry or ()
            lost = [n for n in names if n not in mesh_axes]
            if lost and strict:
                raise SerializationError(
                    f"{where}: array {key!r} was saved sharded along mesh axes {lost}, which "
                    f"the given mesh (axes {list(mesh.axis_names)}) lacks; pass "
                    "strict_mesh=False to replicate along them, or a mesh with those axes"
                )
            kept = tuple(n for n in names if n in mesh_axes)
            entries.append((kept[0] if isinstance(entry, str) else kept) if kept else None)
        out[key] = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*entries))
    return out


@dataclasses.dataclass
class TargetMatch:
    """What a target says about a checkpoint: placements, and what it vouches for."""

    placements: dict[str, Placement]
    classes: dict[int, type] = dataclasses.field(default_factory=dict)
    supplied: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    leaves: dict[int, Any] = dataclasses.field(default_factory=dict)
    #: Nodes whose value is thrown away: the static data of another library's pytree node
    #: that loads into a Struct (the struct's own fields replace it).
    unused: set[int] = dataclasses.field(default_factory=set)


def _describe(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def _leaf_placement(
    target: Any, spec: ArraySpec, prng_impl: str | None, path: str, where: str
) -> Placement:
    import jax

    if target is None:
        return None
    if isinstance(target, jax.ShapeDtypeStruct | jax.Array | np.ndarray):
        shape, dtype = tuple(spec.shape), np.dtype(spec.dtype)
        if prng_impl is not None:
            # Key data has one trailing dimension more than the keys themselves.
            shape = shape[:-1]
            if not jax.numpy.issubdtype(target.dtype, jax.dtypes.prng_key):
                raise SerializationError(
                    f"{where}: the target at {path} has dtype {target.dtype}, but a PRNG key "
                    f"array ({prng_impl}) is stored there; give a key-typed target "
                    "(jax.eval_shape of the key) or None"
                )
        elif target.dtype != dtype:
            raise SerializationError(
                f"{where}: the target at {path} has dtype {target.dtype}, but the stored array "
                f"has dtype {dtype}; fix the target, or give None there to load as stored"
            )
        if tuple(target.shape) != shape:
            raise SerializationError(
                f"{where}: the target at {path} has shape {tuple(target.shape)}, but the stored "
                f"array has shape {shape}; fix the target, or give None there to load as stored"
            )
        return None if isinstance(target, np.ndarray) else getattr(target, "sharding", None)
    raise SerializationError(
        f"{where}: the target at {path} is a {_describe(target)}, but an array is stored "
        "there; give a jax.Array, a jax.ShapeDtypeStruct or None"
    )


def _children_of(
    target: Any, node: list[Any], nodes: list[Any], path: str, where: str
) -> list[tuple[Any, Any, str]]:
    """``(child index, the part of target that should match it, its path)`` per child."""
    tag = node[0]
    kids = children(node)
    aux, flat = None, []
    if tag == DICT and not isinstance(target, Mapping):
        raise SerializationError(
            f"{where}: the target at {path} is {_describe(target)}, but a dict is stored there"
        )
    if tag == PYTREE:
        try:
            aux, flat = _pytree_parts(target, node[2])
        except Exception:
            raise SerializationError(
                f"{where}: the target at {path} is {_describe(target)}, which is not the "
                "registered pytree type stored there"
            ) from None
        if len(flat) != len(kids) - 1:
            raise SerializationError(
                f"{where}: the target at {path} has {len(flat)} children, but "
                f"{len(kids) - 1} are stored there"
            )
    if tag in (LIST, TUPLE, NAMEDTUPLE) and (
        not isinstance(target, list | tuple) or len(target) != len(kids)
    ):
        raise SerializationError(
            f"{where}: the target at {path} is {_describe(target)}"
            f"{f' of length {len(target)}' if isinstance(target, list | tuple) else ''}, but "
            f"a {tag} of length {len(kids)} is stored there"
        )
    out: list[tuple[Any, Any, str]] = []
    for kid in kids:
        step = error_step(nodes, kid)
        part: Any = None  # sets hold no arrays (they are not hashable); keys and codecs: none
        if kid.role == "item" and tag not in (SET, FROZENSET):
            part = target[kid.position]
        elif kid.role == "value":
            key = key_value(nodes[kid.key])
            if key is NOT_A_KEY:
                raise SerializationError(
                    f"{where}: the stored dict at {path} has a key that is not a str, int, "
                    f"float, bool or None ({step[1:-1]}), which a target cannot name; give "
                    "None for the whole dict to load it as stored"
                )
            if key not in target:
                raise SerializationError(
                    f"{where}: the stored dict at {path} has key {key!r}, which the target "
                    "lacks; add it to the target (None places it as stored)"
                )
            part, step = target[key], f"[{key!r}]"
        elif kid.role == "key":
            step = f".<key {kid.position}>"
        elif kid.role == "field":
            part = _field_of(target, str(kid.name), path, where)
        elif kid.role == "payload":
            part = aux
        elif kid.role == "child":
            part = flat[kid.position]
        out.append((kid.index, part, f"{path}{step}"))
    return out


def _field_of(target: Any, name: str, path: str, where: str) -> Any:
    """The target's value of the stored struct field ``name``."""
    if not is_struct_class(type(target)) and not hasattr(target, name):
        raise SerializationError(
            f"{where}: the target at {path} is {_describe(target)}, but a struct with "
            f"field {name!r} is stored there"
        )
    try:
        return getattr(target, name)
    except AttributeError:
        raise SerializationError(
            f"{where}: the stored struct at {path} has field {name!r}, which the target "
            f"{_describe(target)} lacks"
        ) from None


def _ported_children(
    target: Any, node: list[Any], path: str, match: TargetMatch, index: int
) -> list[tuple[Any, Any, str]]:
    """The children of another library's pytree node that loads into the Struct ``target``:
    its named children matched to the struct's fields; the fields it does not store as
    children come from the target."""
    names = child_names(node) or []
    supplied = {
        name: value
        for name, value in _field_values(target).items()
        if name not in names and not _abstract(value)
    }
    if supplied:
        match.supplied[index] = supplied
    return [(node[3], None, f"{path}.<static>")] + [
        (kid, getattr(target, str(name), None), f"{path}.{name}")
        for name, kid in zip(names, node[4], strict=False)
    ]


def mark_unused(nodes: list[Any], top: object, unused: set[int]) -> None:
    """Add the ``callable`` nodes under ``top`` to ``unused`` (their values are not needed)."""
    stack = [top]
    while stack and len(unused) <= len(nodes):
        index = stack.pop()
        if type(index) is not int or not 0 <= index < len(nodes) or index in unused:
            continue
        node = nodes[index]
        if not isinstance(node, list) or not node:
            continue
        if node[0] == CALLABLE:
            unused.add(index)
        try:
            kids = children(node)
        except (MalformedNode, TypeError):
            continue  # malformed: the decoder names it
        stack += [c.index for c in kids if type(c.index) is int and c.index < index]


def _field_values(target: Any) -> dict[str, Any]:
    return {
        spec.name: getattr(target, spec.name)
        for spec in _struct_fields(type(target))
        if not spec.is_derived
    }


def _abstract(value: Any) -> bool:
    import jax

    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(value))


def _pytree_parts(target: Any, mode: object) -> tuple[Any, list[Any]]:
    """``(aux data or None, children)`` of a pytree value, as its stored node lists them."""
    if mode == "j":  # registered with JAX only: its own flatten, one level
        flat = flatten_named(target)
        if flat is None:
            raise TypeError("not a pytree node")
        return flat[1], flat[0]
    from jaxstruct.registry import resolve_pytree_spec

    children, aux = resolve_pytree_spec(type(target)).flatten(target)
    return (aux if mode == "a" else None), list(children)


def _ref_of(cls: type) -> str | None:
    try:
        return class_ref(cls)
    except (ClassReferenceError, TypeError, AttributeError):
        return None


def _unstored_values(target: Any) -> dict[str, Any]:
    """The target struct's values of the fields its class does not store (none abstract)."""
    import jax

    out = {}
    for spec in _struct_fields(type(target)):
        if spec.should_serialize or spec.is_derived:
            continue
        value = getattr(target, spec.name)
        if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(value)):
            out[spec.name] = value
    return out


def match_target(
    nodes: list[Any], root: object, table: Mapping[str, ArraySpec], target: Any, where: str
) -> TargetMatch:
    """Match ``target`` against the stored tree: placements, and what the target vouches for."""
    out: dict[str, Placement] = dict.fromkeys(table)
    match = TargetMatch(out)
    if target is None:
        return match
    if type(root) is not int or not 0 <= root < len(nodes):
        return match  # the decoder reports the malformed manifest
    stack: list[tuple[int, Any, str, bool]] = [(root, target, "root", True)]
    visited = bytearray(len(nodes))
    while stack:
        index, sub, path, strict = stack.pop()
        if visited[index]:
            continue  # a node with two parents: malformed, and the decoder says so
        visited[index] = 1
        node = nodes[index]
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            continue  # malformed: the decoder names it
        try:
            if node[0] in ARRAY_TAGS:
                key = node[1]
                if isinstance(key, str) and key in table:
                    impl = node[2] if node[0] == PRNGKEY and len(node) == 3 else None
                    out[key] = _leaf_placement(sub, table[key], impl, path, where)
                continue
            if sub is None:
                continue
            if node[0] == CALLABLE:
                if callable(sub) and not isinstance(sub, type):
                    match.leaves[index] = sub
                continue
            cls = type(sub)
            if node[0] == CLASS:  # a class as a value: the target holding it vouches
                if isinstance(sub, type) and _ref_of(sub) == node[1]:
                    match.classes[index] = sub
                continue
            if node[0] in CLASS_TAGS and isinstance(node[1], str) and _ref_of(cls) == node[1]:
                match.classes[index] = cls  # the target vouches for the class stored here
                if node[0] == STRUCT and is_struct_class(cls):
                    supplied = _unstored_values(sub)
                    if supplied:
                        match.supplied[index] = supplied
            if node[0] == PYTREE and node[2] == "j" and index in match.classes:
                if is_struct_class(cls):  # stored by another library, a Struct now
                    kids = _ported_children(sub, node, path, match, index)
                    mark_unused(nodes, node[3], match.unused)
                else:
                    kids = _children_of(sub, node, nodes, path, where)
            else:
                kids = _children_of(sub, node, nodes, path, where)
        except (IndexError, TypeError, AttributeError, KeyError, MalformedNode):
            continue  # malformed: the decoder names it
        except SerializationError:
            if strict:
                raise
            continue  # aux data the target holds otherwise: it vouches for nothing there
        lenient = node[0] == PYTREE and len(node) > 2 and node[2] != "s"
        for n, (child, part, child_path) in enumerate(kids):
            if type(child) is int and 0 <= child < index:
                stack.append((child, part, child_path, strict and not (lenient and n == 0)))
    return match


def _struct_fields(cls: type) -> list[Any]:
    """The ``FieldSpec`` objects of a Struct class, in declaration order."""
    import jaxstruct.core as js

    return list(js.fields(cls).values())
