"""repr() summarising arrays, and to_dict()."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np


class Inner(js.Struct):
    w: object
    tag: str = js.field(static=True, default="t")


class Outer(js.Struct):
    inner: Inner
    items: list
    handle: object = js.field(pytree=False, default=None)


def test_repr_summarises_jax_array() -> None:
    """repr shows a JAX array as dtype[shape]."""
    assert repr(Inner(jnp.ones((4, 3)))) == "Inner(w=float32[4,3], tag='t')"


def test_repr_summarises_numpy_array() -> None:
    """repr shows a NumPy array as np.dtype[shape], told apart from a JAX array."""
    assert repr(Inner(np.zeros(2, np.int64))) == "Inner(w=np.int64[2], tag='t')"


def test_repr_scalar_array() -> None:
    """A 0-d array shows empty brackets."""
    assert repr(Inner(jnp.float32(1.0) + jnp.zeros(()))) == "Inner(w=float32[], tag='t')"


def test_repr_arrays_inside_containers() -> None:
    """Arrays inside lists, tuples and dicts are summarised too."""
    out = Outer(Inner(jnp.ones(2)), items=[jnp.ones(3), (jnp.ones(1),), {"k": jnp.ones(5)}])
    assert "[float32[3], (float32[1],), {'k': float32[5]}]" in repr(out)


def test_repr_nested_struct() -> None:
    """A nested struct appears with its own repr."""
    assert repr(Outer(Inner(1), [])) == "Outer(inner=Inner(w=1, tag='t'), items=[], handle=None)"


def test_repr_under_jit_shows_tracer_summary() -> None:
    """Inside jit, a traced field shows as Traced<dtype[shape]>."""
    seen: list[str] = []

    @jax.jit
    def f(s: Inner) -> jax.Array:
        seen.append(repr(s))
        return s.w

    f(Inner(jnp.ones((2, 2))))
    assert seen == ["Inner(w=Traced<float32[2,2]>, tag='t')"]


def test_repr_of_recursive_value_does_not_loop() -> None:
    """A struct reachable from itself (through a mutable field) reprs without recursion."""
    items: list = []
    out = Outer(Inner(1), items)
    items.append(out)
    assert "..." in repr(out)


def test_to_dict_is_shallow_by_default() -> None:
    """to_dict() maps field names to raw values; nested structs stay structs."""
    inner = Inner(1)
    d = Outer(inner, [1]).to_dict()
    assert d == {"inner": inner, "items": [1], "handle": None}
    assert d["inner"] is inner


def test_to_dict_recursive() -> None:
    """to_dict(recursive=True) converts nested structs, also inside containers."""
    d = Outer(Inner(1), [Inner(2)]).to_dict(recursive=True)
    assert d == {
        "inner": {"w": 1, "tag": "t"},
        "items": [{"w": 2, "tag": "t"}],
        "handle": None,
    }


def test_to_dict_include_opaque_false() -> None:
    """to_dict(include_opaque=False) skips opaque fields."""
    assert "handle" not in Outer(Inner(1), []).to_dict(include_opaque=False)


def test_to_dict_includes_derived_fields() -> None:
    """Derived values appear in to_dict()."""

    class P(js.Struct):
        xs: tuple
        n: int = js.field(static=True, init=False, derived=lambda self: len(self.xs))

    assert P((1, 2)).to_dict() == {"xs": (1, 2), "n": 2}


def test_to_dict_returns_a_new_dict() -> None:
    """Mutating the result of to_dict() does not affect the instance."""
    p = Inner(1)
    p.to_dict()["w"] = 5
    assert p.w == 1
