"""``explain_recompiles``: say which struct field made a jitted function compile again.

Cost model. Every call pays for one Python wrapper frame, one read of the
jitted function's dispatch-cache size and one read of a per-thread counter of
JAX tracing events; nothing is flattened or compared. Only when a call adds a
cache entry or traces does the wrapper build a *signature* of the arguments
(classes, static values, opaque identities, leaf shapes and dtypes; never the
array contents) and compare it with the signatures of earlier compilations.

Detection. A new dispatch-cache entry with a new signature is a recompile.
A new entry with a signature seen before is not (JAX keeps separate entries
for, e.g., NumPy and JAX array arguments of the same shape) unless JAX also
traced during the call, which means something outside the arguments changed
(cleared caches, a ``jax.config`` setting). Functions without a dispatch
cache of their own (a plain Python function calling jitted code) are judged
by tracing events alone.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import jax

from ._fields import FieldKind
from ._repr import format_value

__all__ = ["Change", "Recompile", "explain_recompiles"]

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("jaxstruct.recompile")

# JAX reports each trace of a function to jaxpr as this monitoring event.
_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
# Signatures kept per function, newest last; older ones are forgotten.
_KEEP = 64
_SHOWN = 60


class _TraceCounter(threading.local):
    count = 0


_traces = _TraceCounter()
_listening = False


def _on_event(event: str, duration_secs: float, **kwargs: str | int) -> None:
    if event == _TRACE_EVENT:
        _traces.count += 1


def _listen() -> None:
    global _listening  # one listener per process, installed on first use
    if not _listening:
        jax.monitoring.register_event_duration_secs_listener(_on_event)
        _listening = True


ChangeKind = Literal["static", "opaque", "leaf", "type", "structure", "value", "none"]


@dataclasses.dataclass(frozen=True)
class Change:
    """One difference between the arguments of two compilations.

    Attributes:
        path: where it is, from the parameter name (``"state.opt.lr"``).
        kind: ``"static"`` (a static field's value), ``"opaque"`` (an opaque
            field now holds another object; they compare by identity),
            ``"leaf"`` (an array's shape, dtype or weak type), ``"type"``,
            ``"structure"`` (keys, length or pytree structure), ``"value"``
            (a plain Python value: it matters only if the argument is static),
            or ``"none"`` (nothing in the arguments changed).
        owner: the struct class holding the field, if any (``"Adam"``).
        field: the field name in ``owner``, if any (``"lr"``).
        old: the earlier value or summary, as text.
        new: the new value or summary, as text.
    """

    path: str
    kind: ChangeKind
    owner: str | None
    field: str | None
    old: str
    new: str

    def __str__(self) -> str:
        where = f"{self.owner}.{self.field}" if self.owner is not None else None
        if self.kind == "static":
            return f"{self.path}: static field {where} changed {self.old} -> {self.new}"
        if self.kind == "opaque":
            return (
                f"{self.path}: opaque field {where} holds another object "
                f"({self.old} -> {self.new}); opaque fields are compared by identity"
            )
        if self.kind == "leaf":
            if where is None:
                return f"{self.path}: {self.old} -> {self.new}"
            if self.path.endswith(f".{self.field}"):  # the field itself is the array
                return f"{self.path}: node field {where} changed {self.old} -> {self.new}"
            return f"{self.path} (in {where}): {self.old} -> {self.new}"
        if self.kind == "value":
            return (
                f"{self.path}: value {self.old} -> {self.new} "
                "(part of the compile key only if this argument is static)"
            )
        if self.kind == "none":
            return (
                "the arguments match an earlier compilation; the cause is outside "
                "them (jax.clear_caches(), a changed jax.config setting, ...)"
            )
        return f"{self.path}: {self.kind} changed {self.old} -> {self.new}"


@dataclasses.dataclass(frozen=True)
class Recompile:
    """A recompilation of a function watched by :func:`explain_recompiles`.

    Attributes:
        function: the function's name.
        count: how many times it has compiled, this one included.
        changes: what differs from the closest earlier compilation.
    """

    function: str
    count: int
    changes: tuple[Change, ...]

    def __str__(self) -> str:
        lines = [f"{self.function} compiled again (compilation #{self.count}):"]
        lines.extend(f"  {c}" for c in self.changes)
        return "\n".join(lines)


# -- signatures ------------------------------------------------------------------------
# A signature mirrors the argument tree with everything jit keys its cache on
# and nothing else: nodes are tuples tagged by their first item.


def _short(value: Any) -> str:
    text = format_value(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


# jax.typeof is JAX 0.5.3's name for jax.core.get_aval, which older releases (down
# to the floor, 0.4.36) have instead; newer ones deprecate get_aval, so it is only
# looked up when typeof is missing.
_typeof: Callable[[Any], Any] = getattr(jax, "typeof", None) or jax.core.get_aval  # pyright: ignore[reportAttributeAccessIssue]


def _leaf(value: Any) -> tuple[Any, ...]:
    try:
        aval = _typeof(value)
        shape, dtype, weak = aval.shape, aval.dtype, aval.weak_type  # pyright: ignore[reportAttributeAccessIssue]
    except (TypeError, AttributeError):
        return ("object", type(value), _short(value), value)
    summary = f"{format_value(jax.ShapeDtypeStruct(shape, dtype))}"
    summary = summary.removeprefix("ShapeDtypeStruct<").removesuffix(">")
    if weak:
        summary += " (weakly typed)"
    scalar = type(value) in (bool, int, float, complex)
    return ("leaf", summary, value if scalar else _NO_VALUE)


_NO_VALUE = object()


def _signature(value: Any) -> tuple[Any, ...]:
    kind = type(value)
    layout = getattr(kind, "__struct_layout__", None)
    if layout is not None:
        fields = []
        for spec in layout.fields:
            v = getattr(value, spec.name)
            if spec.kind is FieldKind.NODE:
                fields.append((spec.name, "node", _signature(v)))
            elif spec.kind is FieldKind.STATIC:
                fields.append((spec.name, "static", v))
            else:
                fields.append((spec.name, "opaque", (id(v), _short(v))))
        return ("struct", kind, tuple(fields))
    if value is None:
        return ("none",)
    if kind is list or kind is tuple:
        return ("seq", kind, tuple(_signature(v) for v in value))
    if kind is dict:
        return ("dict", kind, tuple((k, _signature(v)) for k, v in value.items()))
    if isinstance(value, jax.Array) or jax.tree_util.all_leaves([value]):
        return _leaf(value)
    # Another pytree node: one level, with JAX's own key paths and structure.
    pairs, treedef = jax.tree_util.tree_flatten_with_path(value, is_leaf=lambda x: x is not value)
    children = tuple((jax.tree_util.keystr(p), _signature(c)) for p, c in pairs)
    return ("node", kind, treedef, children)


# Signature tags whose second item is the value's type.
_TYPED = frozenset({"struct", "seq", "dict", "node", "object"})


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # an __eq__ that raises cannot match, as for jit
        return False


def _diff(
    old: tuple[Any, ...],
    new: tuple[Any, ...],
    path: str,
    owner: tuple[str | None, str | None],
    out: list[Change],
) -> None:
    """Append the differences between signatures ``old`` and ``new`` at ``path``."""
    tag = new[0]
    if old[0] != tag or (tag in _TYPED and old[1] is not new[1]):
        out.append(Change(path, "type", *owner, _kind_name(old), _kind_name(new)))
        return
    if tag == "struct":
        cls_name = new[1].__qualname__
        for (name, kind, a), (_, _, b) in zip(old[2], new[2], strict=True):
            where = (cls_name, name)
            sub = f"{path}.{name}"
            if kind == "node":
                _diff(a, b, sub, where, out)
            elif kind == "static" and not _same(a, b):
                out.append(Change(sub, "static", *where, _short(a), _short(b)))
            elif kind == "opaque" and a[0] != b[0]:
                out.append(Change(sub, "opaque", *where, a[1], b[1]))
    elif tag == "seq":
        if len(old[2]) != len(new[2]):
            out.append(Change(path, "structure", *owner, _shape_of(old), _shape_of(new)))
            return
        for i, (a, b) in enumerate(zip(old[2], new[2], strict=True)):
            _diff(a, b, f"{path}[{i}]", owner, out)
    elif tag == "dict":
        if [k for k, _ in old[2]] != [k for k, _ in new[2]]:
            out.append(Change(path, "structure", *owner, _shape_of(old), _shape_of(new)))
            return
        for (k, a), (_, b) in zip(old[2], new[2], strict=True):
            _diff(a, b, f"{path}[{k!r}]", owner, out)
    elif tag == "node":
        if old[2] != new[2]:
            out.append(Change(path, "structure", *owner, str(old[2]), str(new[2])))
            return
        for (k, a), (_, b) in zip(old[3], new[3], strict=True):
            _diff(a, b, path + k, owner, out)
    elif tag == "leaf":
        if old[1] != new[1]:
            out.append(Change(path, "leaf", *owner, old[1], new[1]))
        elif old[2] is not _NO_VALUE and new[2] is not _NO_VALUE and not _same(old[2], new[2]):
            out.append(Change(path, "value", *owner, _short(old[2]), _short(new[2])))
    elif tag == "object" and not _same(old[3], new[3]):
        out.append(Change(path, "value", *owner, old[2], new[2]))


def _kind_name(sig: tuple[Any, ...]) -> str:
    if sig[0] == "none":
        return "None"
    if sig[0] == "leaf":
        return sig[1]
    return sig[1].__qualname__


def _shape_of(sig: tuple[Any, ...]) -> str:
    if sig[0] == "dict":
        return f"keys {[k for k, _ in sig[2]]!r}"
    return f"{sig[1].__qualname__} of length {len(sig[2])}"


def _explain(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    out: list[Change] = []
    if list(old) != list(new):
        out.append(Change("(arguments)", "structure", None, None, str(list(old)), str(list(new))))
        return out
    for name, sig in new.items():
        _diff(old[name], sig, name, (None, None), out)
    return out


def _rank(changes: list[Change]) -> tuple[int, int]:
    values = sum(c.kind == "value" for c in changes)
    return (len(changes) - values, values)


# -- the wrapper -----------------------------------------------------------------------


def _roots(
    params: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    if params is not None:
        try:
            bound = params.bind(*args, **kwargs)
        except TypeError:
            pass
        else:
            # Omitted arguments count with their defaults, so passing one
            # explicitly reads as a change of that argument.
            bound.apply_defaults()
            return {n: _signature(v) for n, v in bound.arguments.items()}
    roots = {f"args[{i}]": _signature(v) for i, v in enumerate(args)}
    roots.update((n, _signature(v)) for n, v in kwargs.items())
    return roots


def _wrap(fn: Callable[..., Any], on_recompile: Callable[[Recompile], None] | None) -> Any:
    _listen()
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    name = name.rsplit("<locals>.", 1)[-1]
    cache_size = getattr(fn, "_cache_size", None)
    try:
        params: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        params = None
    seen: deque[dict[str, Any]] = deque(maxlen=_KEEP)
    records: deque[Recompile] = deque(maxlen=_KEEP)
    state = [0, 0]  # [compilations so far, dispatch-cache size after the last call]
    traces = _traces

    def compiled(args: tuple[Any, ...], kwargs: dict[str, Any], traced: bool) -> None:
        roots = _roots(params, args, kwargs)
        if not seen:
            state[0] = 1
            seen.append(roots)
            logger.debug("%s compiled for the first time", name)
            return
        best: list[Change] | None = None
        for earlier in reversed(seen):
            changes = _explain(earlier, roots)
            if best is None or _rank(changes) < _rank(best):
                best = changes
        assert best is not None
        if not best and not traced:
            return  # a new dispatch entry for the same compiled program
        state[0] += 1
        if any(c.kind != "value" for c in best):
            # Plain values change on every call for non-static arguments; they
            # explain a recompile only when nothing else does.
            best = [c for c in best if c.kind != "value"]
        if not best:
            best = [Change("(arguments)", "none", None, None, "", "")]
        else:
            seen.append(roots)
        record = Recompile(name, state[0], tuple(best))
        records.append(record)
        if on_recompile is None:
            logger.warning("%s", record)
        else:
            on_recompile(record)

    if cache_size is not None:

        def watched(*args: Any, **kwargs: Any) -> Any:
            before = traces.count
            out = fn(*args, **kwargs)
            size = cache_size()
            traced = traces.count != before
            # After jax.clear_caches() the size can come back to the same number.
            if size != state[1] or traced:
                state[1] = size
                compiled(args, kwargs, traced)
            return out

    else:

        def watched(*args: Any, **kwargs: Any) -> Any:
            before = traces.count
            out = fn(*args, **kwargs)
            if traces.count != before:
                compiled(args, kwargs, True)
            return out

    functools.update_wrapper(watched, fn)
    for attr in ("lower", "trace", "eval_shape", "clear_cache"):
        if hasattr(fn, attr):
            setattr(watched, attr, getattr(fn, attr))
    watched.recompiles = records  # type: ignore[attr-defined]
    return watched


@overload
def explain_recompiles(
    fn: F, /, *, on_recompile: Callable[[Recompile], None] | None = None
) -> F: ...
@overload
def explain_recompiles(
    *, on_recompile: Callable[[Recompile], None] | None = None
) -> Callable[[F], F]: ...
def explain_recompiles(
    fn: Any = None, /, *, on_recompile: Callable[[Recompile], None] | None = None
) -> Any:
    """Wrap a jitted function so each recompilation says which argument field changed.

    A jitted function compiles again whenever a static field of a struct
    argument changes value, an opaque field holds another object, or an
    array's shape or dtype changes. The wrapper reports each such compilation
    as a :class:`Recompile` naming the path from the parameter, the struct
    class and field, and the old and new values (for arrays, the old and new
    ``dtype[shape]``). The first compilation is logged at ``DEBUG`` only.

    Reports go to ``on_recompile`` if given, otherwise to the
    ``"jaxstruct.recompile"`` logger at ``WARNING``. The wrapper also keeps
    the latest reports in its ``recompiles`` attribute and forwards
    ``lower``, ``trace`` and ``eval_shape``. It costs well under a microsecond
    per call, so it can stay on in a debug run.

    Args:
        fn: the function to watch, normally made by ``jax.jit``; any function
            works, and then tracing events of the jitted code it calls are
            what counts. Leave it out to get a decorator.
        on_recompile: called with each :class:`Recompile` instead of logging.

    Returns:
        A function that calls ``fn`` and reports its recompilations (or a
        decorator making one, when ``fn`` is left out).

    Raises:
        TypeError: if ``fn`` is not callable.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> import jaxstruct.core as js
        >>> class Opt(js.Struct):
        ...     w: object
        ...     lr: float = js.field(static=True, default=0.1)
        >>> reports = []
        >>> step = js.explain_recompiles(
        ...     jax.jit(lambda opt: opt.w * opt.lr), on_recompile=reports.append
        ... )
        >>> _ = step(Opt(jnp.ones(3)))
        >>> _ = step(Opt(jnp.ones(3), lr=0.01))
        >>> print(reports[0])
        <lambda> compiled again (compilation #2):
          opt.lr: static field Opt.lr changed 0.1 -> 0.01
    """
    if fn is None:
        return lambda f: explain_recompiles(f, on_recompile=on_recompile)
    if not callable(fn):
        raise TypeError(
            f"explain_recompiles() expected a function (normally jax.jit(f)), got {fn!r}; "
            "wrap the jitted function: explain_recompiles(jax.jit(f))"
        )
    return _wrap(fn, on_recompile)
