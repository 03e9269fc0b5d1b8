"""Opt-in construction-time checking of field annotations: ``typecheck=True``."""

# jaxtyping's dimension strings ("n m", "T") look like forward references to pyflakes.
# ruff: noqa: F722, F821

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest

pytest.importorskip("jaxtyping")
pytest.importorskip("beartype")

from jaxtyping import Array, Float, Int


class Affine(js.Struct, typecheck=True):
    w: Float[Array, "n m"]
    b: Float[Array, "m"]
    name: str = js.field(static=True, default="affine")


class Batched(js.Struct, typecheck=True):
    w: Float[Array, "*batch n m"]
    b: Float[Array, "*batch m"]


class Converted(js.Struct, typecheck=True):
    x: Float[Array, "k"] = js.field(converter=jnp.asarray)


class Unchecked(js.Struct):
    w: Float[Array, "n m"]


def test_matching_values_pass() -> None:
    """Values matching their annotations construct normally."""
    a = Affine(w=jnp.ones((2, 3)), b=jnp.zeros(3))
    assert a.b.shape == (3,)


def test_dimension_binds_across_fields() -> None:
    """m bound by w must be the size of b: a mismatch names field, expected and actual."""
    with pytest.raises(js.ValidationError) as info:
        Affine(w=jnp.ones((2, 3)), b=jnp.zeros(4))
    message = str(info.value)
    assert "Affine.b" in message
    assert "Float[Array, 'm']" in message
    assert "float32[4]" in message
    assert "m=3" in message


def test_dtype_mismatch_fails() -> None:
    """An integer array where floats are declared raises ValidationError naming the dtype."""
    with pytest.raises(
        js.ValidationError,
        match=r"Affine\.w: expected Float\[Array, 'n m'\], got array int32\[2,3\]",
    ):
        Affine(w=jnp.ones((2, 3), dtype=jnp.int32), b=jnp.zeros(3))


def test_rank_mismatch_fails() -> None:
    """An array of the wrong rank fails."""
    with pytest.raises(js.ValidationError, match=r"Affine\.w"):
        Affine(w=jnp.ones(3), b=jnp.zeros(3))


def test_plain_annotation_checked() -> None:
    """Ordinary annotations (a static str) are checked too."""
    with pytest.raises(js.ValidationError, match=r"Affine\.name: expected str, got int 3"):
        Affine(w=jnp.ones((2, 3)), b=jnp.zeros(3), name=3)  # type: ignore[arg-type]


def test_validation_error_is_value_error() -> None:
    """The error is our ValidationError, also a ValueError."""
    with pytest.raises(ValueError):
        Affine(w=jnp.ones((2, 3)), b=jnp.zeros(4))


def test_bindings_do_not_leak_between_instances() -> None:
    """Each construction binds dimensions afresh."""
    Affine(w=jnp.ones((2, 3)), b=jnp.zeros(3))
    Affine(w=jnp.ones((5, 7)), b=jnp.zeros(7))


def test_replace_is_checked() -> None:
    """replace() runs the check on the new values."""
    a = Affine(w=jnp.ones((2, 3)), b=jnp.zeros(3))
    with pytest.raises(js.ValidationError, match=r"Affine\.b"):
        a.replace(b=jnp.zeros(5))


def test_build_is_checked() -> None:
    """js.build() runs the check."""
    with pytest.raises(js.ValidationError, match=r"Affine\.b"):
        js.build(Affine, {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)})


def test_check_runs_after_converters() -> None:
    """The converted value is what gets checked."""
    assert Converted(x=[1.0, 2.0]).x.shape == (2,)


def test_never_on_unflatten() -> None:
    """tree_map and unflatten build instances without the check."""
    a = Affine(w=jnp.ones((2, 3)), b=jnp.zeros(3))
    odd = jax.tree.map(lambda x: x[..., :1] if x.ndim == 1 else x, a)
    assert odd.b.shape == (1,)
    _, treedef = jax.tree_util.tree_flatten(a)
    assert jax.tree_util.tree_unflatten(treedef, [None, "x"]).b == "x"


def test_checked_inside_jit() -> None:
    """Construction inside jit checks the tracers' shapes at trace time."""
    make = jax.jit(lambda w, b: Affine(w=w, b=b))
    assert make(jnp.ones((2, 3)), jnp.ones(3)).w.shape == (2, 3)
    with pytest.raises(js.ValidationError, match=r"Affine\.b"):
        make(jnp.ones((2, 3)), jnp.ones(2))


def test_construction_inside_vmap_sees_unbatched_shapes() -> None:
    """Built inside vmap, each instance is checked with per-example shapes."""
    out = jax.vmap(lambda x: Affine(w=x * jnp.ones((2, 3)), b=x * jnp.ones(3)))(jnp.arange(4.0))
    assert out.w.shape == (4, 2, 3)


def test_star_batch_binds_across_fields() -> None:
    """'*batch' annotations accept batched instances with matching leading axes."""
    Batched(w=jnp.ones((5, 2, 3)), b=jnp.ones((5, 3)))
    Batched(w=jnp.ones((2, 3)), b=jnp.ones(3))
    with pytest.raises(js.ValidationError, match=r"Batched\.b"):
        Batched(w=jnp.ones((5, 2, 3)), b=jnp.ones((4, 3)))


def test_check_types_batched() -> None:
    """check_types(batch_ndim=1) checks a stacked struct against its per-example annotations."""
    stacked = jax.tree.map(
        lambda *xs: jnp.stack(xs), *[Affine(w=jnp.ones((2, 3)), b=jnp.ones(3))] * 4
    )
    js.check_types(stacked, batch_ndim=1)


def test_check_types_batched_wrong_inner_shape() -> None:
    """check_types(batch_ndim=1) reports per-example mismatches."""
    bad = jax.tree.map(
        lambda x: jnp.stack([x[..., :2]] * 4) if x.ndim == 1 else jnp.stack([x] * 4),
        Affine(w=jnp.ones((2, 3)), b=jnp.ones(3)),
    )
    with pytest.raises(js.ValidationError, match=r"Affine\.b"):
        js.check_types(bad, batch_ndim=1)


def test_check_types_batch_axes_disagree() -> None:
    """Leaves with different leading batch axes raise ValidationError."""
    a = Affine(w=jnp.ones((2, 3)), b=jnp.ones(3))
    odd = jax.tree.map(lambda x: jnp.stack([x] * (4 if x.ndim == 2 else 5)), a)
    with pytest.raises(js.ValidationError, match="leading batch"):
        js.check_types(odd, batch_ndim=1)


def test_check_types_on_unchecked_class() -> None:
    """check_types works on any struct, opted in or not."""
    with pytest.raises(js.ValidationError, match=r"Unchecked\.w"):
        js.check_types(Unchecked(w=jnp.ones(3)))


def test_check_types_rejects_non_struct() -> None:
    """check_types() needs a struct instance."""
    with pytest.raises(TypeError, match="struct instance"):
        js.check_types({"w": 1})


def test_unchecked_by_default() -> None:
    """Without typecheck=True nothing is checked at construction."""
    assert Unchecked(w=jnp.ones(3)).w.shape == (3,)


def test_subclass_inherits_check() -> None:
    """A subclass of a checked class is checked, its own fields binding with the parent's."""

    class WithBias(Affine):
        c: Int[Array, "n"] = None  # type: ignore[assignment]

    WithBias(w=jnp.ones((2, 3)), b=jnp.ones(3), c=jnp.ones(2, dtype=jnp.int32))
    with pytest.raises(js.ValidationError, match=r"WithBias\.c"):
        WithBias(w=jnp.ones((2, 3)), b=jnp.ones(3), c=jnp.ones(3, dtype=jnp.int32))


def test_string_annotations_resolved_from_module() -> None:
    """String annotations are resolved in the defining module on first construction."""

    class Stringy(js.Struct, typecheck=True):
        v: "Float[Array, 'k']"

    Stringy(v=jnp.ones(2))
    with pytest.raises(js.ValidationError, match=r"Stringy\.v"):
        Stringy(v=np.ones(2, dtype=np.int64))


def test_unresolvable_annotation_fails() -> None:
    """An annotation naming an unknown type raises StructDefinitionError at first use."""

    class Broken(js.Struct, typecheck=True):
        v: "NoSuchType"  # type: ignore[name-defined]

    with pytest.raises(js.StructDefinitionError, match="cannot resolve"):
        Broken(v=1)


def test_typecheck_keyword_must_be_bool() -> None:
    """typecheck='yes' raises StructDefinitionError."""
    with pytest.raises(js.StructDefinitionError, match="True or False"):

        class Bad(js.Struct, typecheck="yes"):
            x: int


def test_string_annotations_resolved_from_defining_scope() -> None:
    """String annotations may use names local to the function defining the class."""
    from jaxtyping import Array as LocalArray
    from jaxtyping import Float as LocalFloat

    class Local(js.Struct, typecheck=True):
        v: "LocalFloat[LocalArray, 'k']"

    Local(v=jnp.ones(2))
    with pytest.raises(js.ValidationError, match=r"Local\.v"):
        Local(v=np.ones(2, dtype=np.int64))


def test_subclass_can_opt_out() -> None:
    """typecheck=False on a subclass turns the inherited check off."""

    class Loose(Affine, typecheck=False):
        pass

    assert Loose(w=jnp.ones((2, 3)), b=jnp.ones(4)).b.shape == (4,)
