"""Opt-in runtime checking of a struct's field annotations (jaxtyping + beartype).

``class S(Struct, typecheck=True)`` adds one check to the class's
construction lifecycle (``Layout.checks``): after converters and validators,
every annotated field value is checked against its annotation inside a single
jaxtyping memo, so dimension names bind across fields (``w: Float[Array, "n
m"]`` and ``b: Float[Array, "m"]``). The check runs on construction,
``replace`` and ``build``, never on unflatten, so ``jit``, ``vmap`` and
``tree_map`` never see it. Subclasses inherit the keyword.

jaxtyping is required for a class that opts in (imported when the class is
created); beartype, when installed, checks general hints (``list[int]``,
unions, ``PyTree[...]``); without it only plain classes and jaxtyping array
types are checked.
"""

from __future__ import annotations

import os
import random
import sys
import typing
from collections.abc import Callable
from typing import Any

from ._errors import (
    MissingDistributionError,
    Refusal,
    StructDefinitionError,
    ValidationError,
    attach_refusal,
)
from ._meta import class_created_hooks, extension_keywords

__all__ = ["check_types"]

_Checker = Callable[[Any], bool]
#: class -> ((field name, annotation, checker), ...), resolved on first use.
_tables: dict[type, tuple[tuple[str, Any, _Checker], ...]] = {}
_runner: Callable[..., None] | None = None
_OUR_FILES = f"{os.sep}jaxstruct{os.sep}"
#: class -> names of the scope its class statement ran in (typecheck classes only).
_defining_scopes: dict[type, tuple[dict[str, Any], dict[str, Any]]] = {}

INSTALL_HELP = (
    "typecheck=True needs jaxtyping (and beartype for general hints); install them with: "
    "pip install 'jaxstruct-core[jaxtyping]'"
)


def _require_jaxtyping() -> Any:
    try:
        import jaxtyping
    except ImportError as err:
        raise MissingDistributionError(INSTALL_HELP) from err
    return jaxtyping


def _make_checker(hint: Any) -> _Checker | None:
    if hint is Any or hint is object:
        return None
    try:
        from beartype.door import is_bearable
    except ImportError:
        if isinstance(hint, type):
            return lambda value: isinstance(value, hint)
        return None
    if isinstance(hint, type):
        return lambda value: isinstance(value, hint)
    return lambda value: _bearable(value, hint, is_bearable)


def _bearable(value: Any, hint: Any, is_bearable: Callable[[Any, Any], bool]) -> bool:
    """``is_bearable(value, hint)``, leaving the global ``random`` state as it was.

    beartype checks one random item of a container with ``random.getrandbits``,
    which moves the global state: a check inside a Hypothesis draw then trips
    its "do not use the random module inside strategies" deprecation (an error
    under ``-W error``), and a user's seeded ``random`` sequence would depend
    on how many structs were built.
    """
    state = random.getstate()
    try:
        return is_bearable(value, hint)
    finally:
        random.setstate(state)


def _resolve(cls: type) -> tuple[tuple[str, Any, _Checker], ...]:
    table = _tables.get(cls)
    if table is not None:
        return table
    rows: list[tuple[str, Any, _Checker]] = []
    for spec in cls.__struct_layout__.fields:  # type: ignore[attr-defined]
        hint = spec.type
        if isinstance(hint, str):
            owner = spec.owner or cls
            module = sys.modules.get(owner.__module__)
            scope = dict(vars(module)) if module is not None else {}
            defining_globals, defining_locals = _defining_scopes.get(owner, ({}, {}))
            scope.update(defining_globals)
            scope.update(defining_locals)
            try:
                hint = eval(hint, scope, dict(vars(owner)))
            except Exception as err:
                raise StructDefinitionError(
                    f"{cls.__qualname__}.{spec.name}: cannot resolve the annotation "
                    f"{spec.type!r} for typecheck=True ({type(err).__name__}: {err}); define the "
                    "names it uses at module level, or drop typecheck=True"
                ) from None
        if typing.get_origin(hint) is typing.ClassVar:
            continue
        checker = _make_checker(hint)
        if checker is not None:
            rows.append((spec.name, hint, checker))
    table = tuple(rows)
    _tables[cls] = table
    return table


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        kind = "array" if isinstance(shape, tuple) else type(value).__name__
        return f"{kind} {dtype}[{','.join(str(d) for d in shape)}]"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _bindings() -> str:
    try:
        from jaxtyping._storage import get_shape_memo

        single, variadic, _, _ = get_shape_memo()
    except Exception:  # a private jaxtyping helper: the message just gets shorter
        return ""
    parts = [f"{k}={v}" for k, v in single.items() if not k.startswith("~")]
    parts += [f"{k}={v[1]}" for k, v in variadic.items() if not k.startswith("~")]
    return f" (dimensions bound so far: {', '.join(parts)})" if parts else ""


def _check_fields(obj: Any) -> None:
    try:
        from beartype.roar import BeartypeException
    except ImportError:
        BeartypeException = ()

    cls = type(obj)
    for name, hint, checker in _resolve(cls):
        value = getattr(obj, name)
        try:
            ok = checker(value)
        except BeartypeException as err:
            raise StructDefinitionError(
                f"{cls.__qualname__}.{name}: the annotation {hint!r} cannot be checked at "
                f"runtime ({err}); use a checkable annotation or drop typecheck=True"
            ) from None
        if not ok:
            reason = f"expected {_hint_name(hint)}, got {_describe(value)}{_bindings()}"
            err = ValidationError(
                f"{cls.__qualname__}.{name}: {reason}; pass a value matching the annotation"
            )
            raise attach_refusal(err, Refusal(cls, name, "type", reason))


def _hint_name(hint: Any) -> str:
    dims = getattr(hint, "dim_str", None)
    array_type = getattr(hint, "array_type", None)
    if isinstance(hint, type) and dims is not None and array_type is not None:
        # jaxtyping names these after the full module path of the array type;
        # show them as they are written: Float[Array, 'n m'].
        kind = hint.__name__.split("[", 1)[0]
        array_name = str(getattr(array_type, "__name__", array_type)).rpartition(".")[2]
        return f"{kind}[{array_name}, {dims!r}]"
    return hint.__qualname__ if isinstance(hint, type) else repr(hint)


def _run(obj: Any) -> None:
    global _runner
    runner = _runner
    if runner is None:
        jaxtyping = _require_jaxtyping()
        # One jaxtyping memo per call: dimension names bind across the fields
        # of one instance and never leak into the caller's own @jaxtyped scope.
        runner = _runner = jaxtyping.jaxtyped(typechecker=None)(_check_fields)
    runner(obj)


def check_types(obj: Any, *, batch_ndim: int = 0) -> None:
    """Check a struct's field values against their annotations, binding dimension names.

    This is the check ``typecheck=True`` runs at construction; call it directly
    for any struct, e.g. after ``jax.tree.map`` or unflattening, which never
    run it. The structs its node fields hold (directly or in lists, tuples
    and dicts) are checked too, each binding its own dimension names. With
    ``batch_ndim=k`` the struct is taken as a batch of structs
    (as produced by ``vmap`` or stacking): every array node leaf must share the
    same ``k`` leading axes, and the annotations are checked against one
    element of the batch (shapes only, nothing is computed).

    Args:
        obj: a struct instance.
        batch_ndim: number of leading batch axes on every array node leaf.

    Raises:
        ValidationError: a value does not match its annotation, or the batch
            axes disagree.
        MissingDistributionError: jaxtyping is not installed.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> from jaxtyping import Array, Float
        >>> class Affine(js.Struct, typecheck=True):
        ...     w: Float[Array, "n m"]
        ...     b: Float[Array, "m"]
        >>> one = Affine(w=jnp.ones((2, 3)), b=jnp.ones(3))
        >>> js.check_types(one)
        >>> batch = jax.tree.map(lambda x: jnp.stack([x] * 5), one)  # unflatten: not checked
        >>> js.check_types(batch, batch_ndim=1)
        >>> js.check_types(batch)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxstruct.core._errors.ValidationError: Affine.w: expected Float[Array, 'n m'], got ...
    """
    if getattr(type(obj), "__struct_layout__", None) is None:
        raise TypeError(f"check_types() expected a struct instance, got {type(obj).__qualname__}")
    if batch_ndim == 0:
        _check_tree(obj)
        return
    import jax

    leaves = [x for x in jax.tree_util.tree_leaves(obj) if hasattr(x, "shape")]
    batch = {tuple(x.shape[:batch_ndim]) for x in leaves}
    if len(batch) > 1 or any(len(x.shape) < batch_ndim for x in leaves):
        shapes = ", ".join(str(tuple(x.shape)) for x in leaves)
        raise ValidationError(
            f"{type(obj).__qualname__}: expected every array to share {batch_ndim} leading batch "
            f"axes, got shapes {shapes}; stack the instances along the same leading axes"
        )
    index = (0,) * batch_ndim

    def one(tree: Any) -> None:
        element = jax.tree_util.tree_map(lambda x: x[index] if hasattr(x, "shape") else x, tree)
        _check_tree(element)

    # Shapes only: the slicing and the checks run on abstract values.
    jax.eval_shape(one, obj)


def _is_struct(value: Any) -> bool:
    return getattr(type(value), "__struct_layout__", None) is not None


def _check_tree(obj: Any) -> None:
    """Check ``obj`` and every struct its node fields hold, each with its own dimension names."""
    import jax

    _run(obj)
    for name in type(obj).__struct_layout__.node_names:
        for leaf in jax.tree_util.tree_leaves(getattr(obj, name), is_leaf=_is_struct):
            if _is_struct(leaf):
                _check_tree(leaf)


def _install_check(cls: type) -> None:
    layout = cls.__struct_layout__  # type: ignore[attr-defined]
    if _run not in layout.checks:
        layout.checks = (*layout.checks, _run)
        # finish() runs only for classes with hooks; the generated __init__ is
        # compiled on first instantiation, so setting this now is in time.
        layout.has_hooks = True


def _keyword(cls: type, value: Any) -> None:
    if not isinstance(value, bool):
        raise StructDefinitionError(
            f"{cls.__qualname__}: typecheck= expected True or False, got {value!r}"
        )
    if value:
        _require_jaxtyping()


def _defining_scope() -> tuple[dict[str, Any], dict[str, Any]]:
    """The globals (live) and locals (a copy) where the class statement ran."""
    frame = sys._getframe(1)
    while frame is not None:
        # Skip our own layers' frames by file, not by module name: a doctest
        # runs in a copy of a jaxstruct module's globals.
        inside = _OUR_FILES in frame.f_code.co_filename
        name = frame.f_globals.get("__name__", "")
        if not inside and name not in ("abc", "typing", "typing_extensions"):
            return frame.f_globals, dict(frame.f_locals)
        frame = frame.f_back
    return {}, {}


def _on_class(cls: type) -> None:
    if getattr(cls, "__struct_options__", {}).get("typecheck"):
        _install_check(cls)
        # String annotations (``from __future__ import annotations``) are
        # resolved lazily, at the first check, so that forward references
        # work; keep the names of the defining scope for that moment.
        _defining_scopes[cls] = _defining_scope()


def install() -> None:
    """Register the ``typecheck=`` class keyword (called once by ``jaxstruct.core``)."""
    extension_keywords["typecheck"] = _keyword
    class_created_hooks.append(_on_class)


install()
