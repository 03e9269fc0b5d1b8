"""repr() showing arrays (values when small, dtype[shape] otherwise), and to_dict()."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest


class Inner(js.Struct):
    w: object
    tag: str = js.field(static=True, default="t")


class Outer(js.Struct):
    inner: Inner
    items: list
    handle: object = js.field(pytree=False, default=None)


def test_repr_shows_small_jax_array_values() -> None:
    """A JAX array of at most 16 elements shows its values, as its own repr does."""
    assert repr(Inner(jnp.arange(3.0))) == "Inner(w=Array([0., 1., 2.], dtype=float32), tag='t')"
    assert js.pformat(Inner(jnp.arange(16)), width=200) == (
        "Inner(w=Array([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15], "
        "dtype=int32), tag='t')"
    )


def test_repr_summarises_large_jax_array() -> None:
    """A JAX array of more than 16 elements shows as dtype[shape]."""
    assert repr(Inner(jnp.ones(17))) == "Inner(w=float32[17], tag='t')"
    assert repr(Inner(jnp.ones((4, 5)))) == "Inner(w=float32[4,5], tag='t')"


def test_repr_numpy_array_values_and_summary() -> None:
    """A NumPy array shows NumPy's repr when small, np.dtype[shape] when large."""
    assert repr(Inner(np.arange(2))) == "Inner(w=array([0, 1]), tag='t')"
    assert repr(Inner(np.zeros(20, np.int64))) == "Inner(w=np.int64[20], tag='t')"


def test_repr_of_multidimensional_array_stays_on_one_line() -> None:
    """The rows numpy prints on several lines are joined, so the layout holds."""
    text = repr(Inner(jnp.arange(6.0).reshape(2, 3)))
    assert text == "Inner(w=Array([[0., 1., 2.], [3., 4., 5.]], dtype=float32), tag='t')"


def test_repr_scalar_array() -> None:
    """A 0-d array shows its value, and empty brackets when summarised."""
    assert repr(Inner(jnp.zeros((), jnp.int32))) == "Inner(w=Array(0, dtype=int32), tag='t')"
    with js.printoptions(threshold=0):
        assert repr(Inner(jnp.zeros(()))) == "Inner(w=float32[], tag='t')"


def test_repr_empty_array_shows_its_shape() -> None:
    """An array with no elements shows dtype[shape]: its shape is all there is to see."""
    assert repr(Inner(jnp.zeros((0, 3)))) == "Inner(w=float32[0,3], tag='t')"
    assert repr(Inner(np.zeros(0, np.float32))) == "Inner(w=np.float32[0], tag='t')"


def test_repr_arrays_inside_containers() -> None:
    """Arrays inside lists, tuples and dicts show values or summaries too."""
    out = Outer(Inner(jnp.ones(2)), items=[jnp.ones(3), (jnp.ones(20),), {"k": np.ones(1)}])
    assert js.pformat(out.items, width=200) == (
        "[Array([1., 1., 1.], dtype=float32), (float32[20],), {'k': array([1.])}]"
    )
    assert "inner=Inner(w=Array([1., 1.], dtype=float32), tag='t')," in repr(out)


def test_repr_follows_numpy_print_options() -> None:
    """The values are written by numpy, so numpy's precision applies."""
    with np.printoptions(precision=2):
        assert repr(Inner(jnp.asarray([1 / 3]))) == (
            "Inner(w=Array([0.33], dtype=float32), tag='t')"
        )


def test_repr_key_array_is_summarised() -> None:
    """A typed PRNG key shows its key dtype and shape, not its key data."""
    assert repr(Inner(jax.random.key(0))) == "Inner(w=key<fry>[], tag='t')"


def test_repr_of_deleted_array_is_its_summary() -> None:
    """A deleted (donated) array, whose values are gone, shows dtype[shape]."""
    w = jnp.ones(3)
    w.delete()
    assert repr(Inner(w)) == "Inner(w=float32[3], tag='t')"


def test_repr_of_an_array_whose_repr_fails_is_its_summary() -> None:
    """An array whose own repr raises (a transfer guard, a broken subclass) is summarised."""

    class Unprintable(np.ndarray):
        def __repr__(self) -> str:
            raise RuntimeError("no copy to the host allowed")

    w = np.zeros(3, np.float32).view(Unprintable)
    assert repr(Inner(w)) == "Inner(w=np.float32[3], tag='t')"


def test_printoptions_threshold_sets_the_size_shown_by_value() -> None:
    """printoptions(threshold=n) shows arrays of at most n elements; 0 shows none."""
    with js.printoptions(threshold=3) as options:
        assert options == {"threshold": 3}
        assert repr(Inner(jnp.ones(3))) == "Inner(w=Array([1., 1., 1.], dtype=float32), tag='t')"
        assert repr(Inner(jnp.ones(4))) == "Inner(w=float32[4], tag='t')"
    with js.printoptions(threshold=0):
        assert repr(Inner(jnp.ones(1))) == "Inner(w=float32[1], tag='t')"
    with js.printoptions(threshold=100):
        text = js.pformat(Inner(jnp.zeros(100)), width=1000)
        assert text == f"Inner(w=Array([{', '.join(['0.'] * 100)}], dtype=float32), tag='t')"
    assert js.get_printoptions() == {"threshold": 16}


def test_printoptions_restores_the_setting_after_an_error() -> None:
    """The setting in force before the with block comes back when the block raises."""
    js.set_printoptions(threshold=5)
    try:
        try:
            with js.printoptions(threshold=0):
                raise KeyError("boom")
        except KeyError:
            pass
        assert js.get_printoptions() == {"threshold": 5}
        js.set_printoptions()  # None changes nothing
        assert js.get_printoptions() == {"threshold": 5}
    finally:
        js.set_printoptions(threshold=16)


def test_set_printoptions_rejects_bad_thresholds() -> None:
    """A negative or non-int threshold is a clear error naming it; nothing changes."""
    with pytest.raises(ValueError, match="threshold must be 0 or more"):
        js.set_printoptions(threshold=-1)
    for bad in (1.5, True, "8"):
        with pytest.raises(TypeError, match="threshold expected an int"):
            js.set_printoptions(threshold=bad)  # type: ignore[arg-type]
    assert js.get_printoptions() == {"threshold": 16}


def test_print_shows_values() -> None:
    """print() of a struct shows the values of its small arrays."""
    assert str(Inner(jnp.arange(2))) == "Inner(w=Array([0, 1], dtype=int32), tag='t')"


def test_jax_debug_print_under_jit_shows_values(capsys: pytest.CaptureFixture[str]) -> None:
    """jax.debug.print of a struct inside jit shows the run-time values of small arrays."""

    @jax.jit
    def f(s: Inner) -> Inner:
        jax.debug.print("{s}", s=s)
        return s

    jax.block_until_ready(f(Inner(jnp.arange(3.0))))
    jax.block_until_ready(f(Inner(jnp.ones(20))))
    jax.effects_barrier()
    assert capsys.readouterr().out.splitlines() == [
        "Inner(w=Array([0., 1., 2.], dtype=float32), tag='t')",
        "Inner(w=float32[20], tag='t')",
    ]


def test_repr_nested_struct() -> None:
    """A nested struct appears with its own repr."""
    assert repr(Outer(Inner(1), [])) == "Outer(inner=Inner(w=1, tag='t'), items=[], handle=None)"


def test_repr_under_jit_shows_tracer_summary() -> None:
    """Inside jit, a traced field shows as Traced<dtype[shape]>."""
    seen: list[str] = []

    @jax.jit
    def f(s: Inner) -> object:
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
