"""The same four models defined with every container under comparison.

Each implementation provides the classes ``S`` (TrainState-like: node fields
``a b c d``, static ``step: int`` and ``tag: str``), ``N`` (nested: node fields
``p q r s`` holding ``S``), ``L`` (a link of the deep chain: node fields ``x``
and ``child``, static ``depth: int``) and ``H`` (hooked: ``a`` has a converter,
``b`` a validator, static ``n`` is derived from ``b``), plus the spelling of
construction, ``replace`` and attribute reads, and a function that defines
``count`` TrainState-like classes.

The benchmark statements are generated from that spelling so that each
implementation is timed on the code its users would write, with no wrapper
call in between.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["IMPLEMENTATION_NOTES", "Impl", "load_impls"]

IMPLEMENTATION_NOTES = {
    "dict": (
        "plain dicts of the node fields; a dict has nowhere to keep static data, so `step`, "
        "`tag`, `depth` and `n` are left out. Hooked: a factory function doing the conversion "
        "and validation; replace: `{**d, 'a': y}` (hooked: the factory called again)."
    ),
    "regdc": (
        "`@jax.tree_util.register_dataclass` over `@dataclasses.dataclass(frozen=True)`, statics "
        "marked with `metadata={'static': True}`. Hooked: `__post_init__` converts `a`, checks "
        "`b` and sets `n` (declared `init=False`, so it is not part of the pytree and is "
        "recomputed on every unflatten). replace: `dataclasses.replace`."
    ),
    "flax": (
        "`@flax.struct.dataclass` with `flax.struct.field(pytree_node=False)` statics. Hooked: "
        "the same `__post_init__`; `n` must be an init field (flax registers every field), so it "
        "has a placeholder default that `__post_init__` overwrites. replace: `obj.replace`."
    ),
    "equinox": (
        "`equinox.Module` with `eqx.field(static=True)`. Hooked: `eqx.field(converter=...)`, "
        "`__check_init__` for the validator and `__post_init__` setting the `init=False` static "
        "`n`. replace: `dataclasses.replace` (like for like; `eqx.tree_at` is a different, "
        "slower operation)."
    ),
    "jaxstruct": (
        "`jaxstruct.core.Struct` with `js.field(static=True)`, `converter=`, `validator=` and "
        "`derived=`. replace: `obj.replace`."
    ),
}


def _check_b(b: Any) -> bool:
    return b.ndim == 1


@dataclass
class Impl:
    """One container implementation: its classes and how its users spell things."""

    name: str
    ns: dict[str, Any]
    define_classes: Callable[[int], None] | None
    method_replace: bool = False
    is_dict: bool = False

    def new(self, cls: str, nodes: dict[str, str], statics: dict[str, str]) -> str:
        """Return the expression constructing ``cls`` from expression strings."""
        if self.is_dict and cls != "H":
            return "{" + ", ".join(f"{k!r}: {v}" for k, v in nodes.items()) + "}"
        args = ", ".join(f"{k}={v}" for k, v in {**nodes, **statics}.items())
        return f"{cls}({args})"

    def replace(self, obj: str, cls: str, field: str, value: str) -> str:
        """Return the expression replacing ``field`` of ``obj`` (an instance of ``cls``)."""
        if self.is_dict:
            merged = f"{{**{obj}, {field!r}: {value}}}"
            return f"H(**{merged})" if cls == "H" else merged
        if self.method_replace:
            return f"{obj}.replace({field}={value})"
        return f"replace({obj}, {field}={value})"

    def get(self, obj: str, field: str) -> str:
        """Return the expression reading ``field`` of ``obj``."""
        return f"{obj}[{field!r}]" if self.is_dict else f"{obj}.{field}"


def _dict_impl() -> Impl:
    def H(a: Any, b: Any) -> dict[str, Any]:
        a = jnp.asarray(a)
        if not _check_b(b):
            raise ValueError("b must be 1-d")
        return {"a": a, "b": b}

    return Impl("dict", {"H": H}, None, is_dict=True)


def _regdc_impl() -> Impl:
    from dataclasses import field

    from jax.tree_util import register_dataclass

    def static(default: Any = dataclasses.MISSING) -> Any:
        return field(default=default, metadata={"static": True})

    @register_dataclass
    @dataclass(frozen=True)
    class S:
        a: Any
        b: Any
        c: Any
        d: Any
        step: int = static(0)
        tag: str = static("run")

    @register_dataclass
    @dataclass(frozen=True)
    class N:
        p: Any
        q: Any
        r: Any
        s: Any

    @register_dataclass
    @dataclass(frozen=True)
    class L:
        x: Any
        child: Any
        depth: int = static(0)

    @dataclass(frozen=True)
    class H:
        a: Any
        b: Any
        n: int = field(init=False, metadata={"static": True})

        def __post_init__(self) -> None:
            object.__setattr__(self, "a", jnp.asarray(self.a))
            if not _check_b(self.b):
                raise ValueError("b must be 1-d")
            object.__setattr__(self, "n", self.b.shape[0])

    register_dataclass(H, data_fields=["a", "b"], meta_fields=[])

    def define_classes(count: int) -> None:
        for _ in range(count):

            @register_dataclass
            @dataclass(frozen=True)
            class S:
                a: Any
                b: Any
                c: Any
                d: Any
                step: int = static(0)
                tag: str = static("run")

    ns = {"S": S, "N": N, "L": L, "H": H, "replace": dataclasses.replace}
    return Impl("regdc", ns, define_classes)


def _flax_impl() -> Impl:
    from flax import struct

    @struct.dataclass
    class S:
        a: Any
        b: Any
        c: Any
        d: Any
        step: int = struct.field(pytree_node=False, default=0)
        tag: str = struct.field(pytree_node=False, default="run")

    @struct.dataclass
    class N:
        p: Any
        q: Any
        r: Any
        s: Any

    @struct.dataclass
    class L:
        x: Any
        child: Any
        depth: int = struct.field(pytree_node=False, default=0)

    @struct.dataclass
    class H:
        a: Any
        b: Any
        n: int = struct.field(pytree_node=False, default=-1)

        def __post_init__(self) -> None:
            object.__setattr__(self, "a", jnp.asarray(self.a))
            if not _check_b(self.b):
                raise ValueError("b must be 1-d")
            object.__setattr__(self, "n", self.b.shape[0])

    def define_classes(count: int) -> None:
        for _ in range(count):

            @struct.dataclass
            class S:
                a: Any
                b: Any
                c: Any
                d: Any
                step: int = struct.field(pytree_node=False, default=0)
                tag: str = struct.field(pytree_node=False, default="run")

    return Impl("flax", {"S": S, "N": N, "L": L, "H": H}, define_classes, method_replace=True)


def _equinox_impl() -> Impl:
    import equinox as eqx

    class S(eqx.Module):
        a: Any
        b: Any
        c: Any
        d: Any
        step: int = eqx.field(static=True, default=0)
        tag: str = eqx.field(static=True, default="run")

    class N(eqx.Module):
        p: Any
        q: Any
        r: Any
        s: Any

    class L(eqx.Module):
        x: Any
        child: Any
        depth: int = eqx.field(static=True, default=0)

    class H(eqx.Module):
        a: Any = eqx.field(converter=jnp.asarray)
        b: Any
        n: int = eqx.field(static=True, init=False)

        def __post_init__(self) -> None:
            self.n = self.b.shape[0]

        def __check_init__(self) -> None:
            if not _check_b(self.b):
                raise ValueError("b must be 1-d")

    def define_classes(count: int) -> None:
        for _ in range(count):

            class S(eqx.Module):
                a: Any
                b: Any
                c: Any
                d: Any
                step: int = eqx.field(static=True, default=0)
                tag: str = eqx.field(static=True, default="run")

    ns = {"S": S, "N": N, "L": L, "H": H, "replace": dataclasses.replace}
    return Impl("equinox", ns, define_classes)


def _jaxstruct_impl() -> Impl:
    import jaxstruct.core as js

    class S(js.Struct):
        a: Any
        b: Any
        c: Any
        d: Any
        step: int = js.field(static=True, default=0)
        tag: str = js.field(static=True, default="run")

    class N(js.Struct):
        p: Any
        q: Any
        r: Any
        s: Any

    class L(js.Struct):
        x: Any
        child: Any
        depth: int = js.field(static=True, default=0)

    class H(js.Struct):
        a: Any = js.field(converter=jnp.asarray)
        b: Any = js.field(validator=_check_b)
        n: int = js.field(static=True, init=False, derived=lambda self: self.b.shape[0])

    def define_classes(count: int) -> None:
        for _ in range(count):

            class S(js.Struct):
                a: Any
                b: Any
                c: Any
                d: Any
                step: int = js.field(static=True, default=0)
                tag: str = js.field(static=True, default="run")

    return Impl("jaxstruct", {"S": S, "N": N, "L": L, "H": H}, define_classes, method_replace=True)


_LOADERS: dict[str, Callable[[], Impl]] = {
    "dict": _dict_impl,
    "regdc": _regdc_impl,
    "flax": _flax_impl,
    "equinox": _equinox_impl,
    "jaxstruct": _jaxstruct_impl,
}


def load_impls(names: list[str] | None = None) -> tuple[list[Impl], dict[str, str]]:
    """Define the models with every available implementation.

    Returns:
        The implementations that loaded, and for each that did not, why (a peer
        missing from the environment, or a ``jaxstruct.core`` that cannot yet
        define the models).
    """
    impls: list[Impl] = []
    failures: dict[str, str] = {}
    for name, loader in _LOADERS.items():
        if names is not None and name not in names:
            continue
        try:
            impls.append(loader())
        except Exception as err:
            failures[name] = f"{type(err).__name__}: {err}"
    return impls, failures


# Make sure the JAX CPU backend exists before anything is timed.
jax.devices()
