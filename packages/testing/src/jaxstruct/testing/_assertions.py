"""``assert_roundtrip`` and ``assert_pytree_roundtrip``: the core properties of a struct value."""

from __future__ import annotations

import functools
import importlib
import math
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jaxstruct.core as js
import numpy as np
from jaxstruct.core import FieldKind, FieldSpec

from ._compare import difference, first_difference, serialized

__all__ = ["FORMATS", "assert_pytree_roundtrip", "assert_roundtrip"]

#: The serialisation paths ``assert_roundtrip`` checks by default.
FORMATS = ("state_dict", "directory", "zip")


def _io() -> Any:
    try:
        module = importlib.import_module("jaxstruct.io")
    except ModuleNotFoundError:
        module = None
    if module is None or not all(
        hasattr(module, name) for name in ("to_state_dict", "from_state_dict", "export", "load")
    ):
        from jaxstruct.core import MissingDistributionError

        raise MissingDistributionError(
            "assert_roundtrip needs the 'jaxstruct-io' distribution; install it with: "
            "pip install jaxstruct-io"
        )
    return module


def _fail(what: str, problem: str) -> AssertionError:
    return AssertionError(f"{what}: the restored value differs from the original at {problem}")


def assert_roundtrip(
    x: Any,
    *,
    formats: Iterable[str] = FORMATS,
    tmp_path: str | Path | None = None,
    strict: bool = False,
    exclude: Iterable[str] = (),
) -> None:
    """Assert ``x`` survives serialisation: state dict, directory and zip, leaf by leaf.

    Every serialised field must come back with the same type, dtype, shape and
    bits; derived fields must be recomputed to the same value. Fields that are
    not serialised (opaque ones, by default) are not compared, unless
    ``strict``: then node and static fields declared ``serialize=False`` must
    come back equal too (a counter or a key left out of checkpoints by
    mistake loads as its default, and fails), except those named in
    ``exclude`` (state the code supplies on purpose, such as an optimiser
    ``tx`` kept out of checkpoints).

    Args:
        x: a struct instance (or any value ``jaxstruct.io`` can serialise).
        formats: which of ``"state_dict"``, ``"directory"`` and ``"zip"`` to check;
            any registered format's name (a plugin's: ``"tar"``) is accepted too.
        tmp_path: where to write the checkpoints; a temporary directory by default.
        strict: also compare node and static fields declared ``serialize=False``.
        exclude: names of ``serialize=False`` fields (of any struct inside ``x``)
            that ``strict`` leaves out.

    Raises:
        AssertionError: naming the format and the first differing path, e.g.
            ``zip: ... at x.params['w']: dtype float32 != float64``.
        ValueError: an unknown format name, or a name in ``exclude`` that is no
            field of a struct inside ``x``.
        MissingDistributionError: ``jaxstruct-io`` is not installed.

    Example:
        >>> import numpy as np
        >>> import jaxstruct.core as js
        >>> from jaxstruct.testing import assert_roundtrip
        >>> class State(js.Struct):
        ...     w: np.ndarray
        ...     step: int = js.field(static=True, default=0)
        >>> assert_roundtrip(State(w=np.arange(3.0)))
    """
    wanted = tuple(formats)
    io = _io()
    known = ("state_dict", *io.current_registry().formats)
    unknown = [f for f in wanted if f not in known]
    if unknown:
        raise ValueError(
            f"assert_roundtrip(): unknown format(s) {unknown!r}; expected some of {known!r} "
            '("state_dict" or a registered format)'
        )
    excluded = frozenset([exclude] if isinstance(exclude, str) else exclude)
    missing = excluded - _field_names(x)
    if missing:
        raise ValueError(
            f"assert_roundtrip(exclude=...): {sorted(missing)} is not the name of a field of any "
            f"struct inside x; fields are {sorted(_field_names(x))}"
        )
    check = functools.partial(_check, strict=strict, excluded=excluded)
    if "state_dict" in wanted:
        restored = io.from_state_dict(io.to_state_dict(x))
        check(x, restored, "state_dict")
    files = [f for f in wanted if f != "state_dict"]
    if not files:
        return
    if tmp_path is None:
        with tempfile.TemporaryDirectory(prefix="jaxstruct-roundtrip-") as tmp:
            _check_files(io, x, Path(tmp), files, check)
    else:
        _check_files(io, x, Path(tmp_path), files, check)


def _check_files(
    io: Any, x: Any, root: Path, files: list[str], check: Callable[[Any, Any, str], None]
) -> None:
    registered = io.current_registry().formats
    for fmt in files:
        suffixes = registered[fmt].suffixes
        stem = "checkpoint" if fmt in FORMATS else f"checkpoint-{fmt}"
        target = root / f"{stem}{suffixes[0] if suffixes else ''}"
        io.export(x, target, format=fmt, overwrite=True)
        check(x, io.load(target), fmt)


def _field_names(x: Any) -> set[str]:
    """The field names of every struct inside ``x`` (nested ones and those in containers)."""
    names: set[str] = set()
    stack = [x]
    while stack:
        value = stack.pop()
        if js.is_struct(value):
            names.update(js.fields(value))
            stack += [getattr(value, name, None) for name in js.fields(value)]
        elif isinstance(value, dict):
            stack += list(value.values())
        elif isinstance(value, list | tuple):
            stack += list(value)
    return names


def _strictly(spec: FieldSpec, excluded: frozenset[str] = frozenset()) -> bool:
    if spec.name in excluded and not serialized(spec):
        return False
    # Opaque fields are not data (callables, handles): still skipped unless stored.
    return serialized(spec) or spec.kind is not FieldKind.OPAQUE


def _check(
    x: Any,
    restored: Any,
    what: str,
    *,
    strict: bool = False,
    excluded: frozenset[str] = frozenset(),
) -> None:
    problem = difference(x, restored, "x", serialized)
    if problem:
        raise _fail(what, problem)
    if strict:
        problem = difference(x, restored, "x", functools.partial(_strictly, excluded=excluded))
        if problem:
            raise _fail(what, problem + _NOT_STORED)


_NOT_STORED = (
    " (strict=True: the field is declared serialize=False, so exports do not store it and "
    "loading gives its default; drop serialize=False if it is state to keep, or leave it out "
    "of the check with exclude=[its name])"
)


def _is_array_like(leaf: Any) -> bool:
    """Whether ``jit`` takes the leaf without narrowing it (which warns, or overflows)."""
    import jax

    if isinstance(leaf, jax.Array):
        return True
    if isinstance(leaf, np.ndarray | np.generic):
        return jax.dtypes.canonicalize_dtype(leaf.dtype) == leaf.dtype
    if isinstance(leaf, bool):
        return True
    x64 = bool(jax.config.read("jax_enable_x64"))
    if isinstance(leaf, int):
        return x64 or -(2**31) <= leaf < 2**31
    if isinstance(leaf, float | complex):
        parts = (leaf.real, leaf.imag) if isinstance(leaf, complex) else (leaf,)
        return x64 or all(not math.isfinite(p) or abs(p) <= _F32_MAX for p in parts)
    return False


_F32_MAX = float(np.finfo(np.float32).max)


@functools.cache
def _jit_identity() -> Any:
    """One jitted identity for every call: a fresh ``jax.jit`` per call compiled every time
    (about 14 ms a call); this one compiles once per leaf signature."""
    import jax

    return jax.jit(_identity)


def _identity(leaves: Any) -> Any:
    return leaves


def assert_pytree_roundtrip(x: Any) -> None:
    """Assert ``x`` survives flatten/unflatten and passes through ``jax.jit`` unchanged.

    Checks that unflattening the flattened form gives an equal value (every
    field, opaque ones included, types and bits exact), that flattening again
    gives the same tree structure and key paths, and that the identity function
    under ``jit`` returns the same structure with the same leaves, up to JAX's
    own conversions (NumPy arrays and Python numbers become JAX arrays). Leaves
    ``jit`` would narrow (64-bit values without ``jax_enable_x64``) and
    non-array leaves are held static.

    Raises:
        AssertionError: naming the check and the first differing path.

    Example:
        >>> import jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> from jaxstruct.testing import assert_pytree_roundtrip
        >>> class P(js.Struct):
        ...     w: object
        ...     name: str = js.field(static=True, default="p")
        >>> assert_pytree_roundtrip(P(w=[jnp.ones(2), 3.0]))
    """
    import jax
    import jax.numpy as jnp

    with_paths, treedef = jax.tree_util.tree_flatten_with_path(x)
    leaves = [leaf for _, leaf in with_paths]
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    problem = first_difference(x, rebuilt)
    if problem:
        raise AssertionError(f"flatten/unflatten: the rebuilt value differs at {problem}")
    again, treedef2 = jax.tree_util.tree_flatten_with_path(rebuilt)
    if treedef2 != treedef:
        raise AssertionError(
            f"flatten/unflatten: the tree structure changed: {treedef} != {treedef2}"
        )
    paths = [jax.tree_util.keystr(p) for p, _ in with_paths]
    paths2 = [jax.tree_util.keystr(p) for p, _ in again]
    if paths != paths2:
        first = next((i for i, (a, b) in enumerate(zip(paths, paths2, strict=True)) if a != b), 0)
        raise AssertionError(
            f"flatten/unflatten: key path {paths[first]!r} became {paths2[first]!r}"
        )
    dynamic = [leaf if _is_array_like(leaf) else None for leaf in leaves]
    out = _jit_identity()(dynamic)
    for path, leaf, got in zip(paths, leaves, out, strict=True):
        if leaf is None or not _is_array_like(leaf):
            continue
        problem = first_difference(jnp.asarray(leaf), got, f"x{path}")
        if problem:
            raise AssertionError(f"jit identity: a leaf changed at {problem}")
    merged = [got if _is_array_like(leaf) else leaf for leaf, got in zip(leaves, out, strict=True)]
    through = jax.tree_util.tree_unflatten(treedef, merged)
    if jax.tree_util.tree_structure(through) != treedef:
        raise AssertionError("jit identity: the tree structure (static fields) changed")
