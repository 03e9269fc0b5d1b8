"""structs(P, **{"initial.cov": s}) overrides one nested field and derives the rest."""

# ruff: noqa: F722 (jaxtyping shape strings are not forward references)
from __future__ import annotations

from typing import Annotated, Any

import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxstruct.core.constraints import positive_definite
from jaxstruct.testing import structs
from jaxtyping import Array, Float

EXAMPLES = settings(max_examples=30, database=None, deadline=None)


class Initial(js.Struct):
    mean: Float[Array, " n"]
    cov: Annotated[Float[Array, "n n"], positive_definite]


class Dynamics(js.Struct):
    weights: Float[Array, "n n"]
    cov: Annotated[Float[Array, "n n"], positive_definite]


class Params(js.Struct):
    initial: Initial
    dynamics: Dynamics
    label: str = js.field(static=True, default="lgssm")


class Model(js.Struct):
    params: Params
    steps: int = js.field(static=True, default=3)


def _run(strategy: st.SearchStrategy[Any], check: Any) -> None:
    @EXAMPLES
    @given(strategy)
    def run(x: Any) -> None:
        check(x)

    run()


def test_path_override_replaces_one_nested_field() -> None:
    """'initial.cov' takes the given value; the other nested fields are still drawn."""
    eye = jnp.eye(2) * 3

    def check(p: Params) -> None:
        assert p.initial.cov is eye
        assert p.initial.mean.shape == (2,) and p.dynamics.weights.shape == (2, 2)

    _run(structs(Params, **{"initial.cov": st.just(eye)}), check)


def test_path_override_shares_named_sizes() -> None:
    """The overridden array's shape binds the named sizes of the whole instance."""

    def check(p: Params) -> None:
        n = p.initial.cov.shape[0]
        assert p.initial.mean.shape == (n,) and p.dynamics.cov.shape == (n, n)

    covs = st.sampled_from([jnp.eye(1), jnp.eye(3)])
    _run(structs(Params, **{"initial.cov": covs}), check)


def test_path_override_goes_deeper() -> None:
    """A path of three names reaches a field two structs down."""

    def check(m: Model) -> None:
        assert m.params.dynamics.weights.shape == (2, 2)
        assert float(m.params.dynamics.weights[0, 1]) == 0.5

    weights = st.just(jnp.full((2, 2), 0.5))
    _run(structs(Model, **{"params.dynamics.weights": weights}), check)


def test_path_override_may_depend_on_siblings() -> None:
    """A path override may be a function of the nested struct's other fields."""

    def check(p: Params) -> None:
        assert p.initial.cov.shape == (p.initial.mean.shape[0],) * 2
        assert np.allclose(np.asarray(p.initial.cov), np.eye(p.initial.mean.shape[0]))

    def identity(mean: Any) -> st.SearchStrategy[Any]:
        return st.just(jnp.eye(mean.shape[0]))

    _run(structs(Params, **{"initial.cov": identity}), check)


def test_path_and_plain_overrides_combine() -> None:
    """Overrides of a field and of a nested field work together, with sizes= too."""

    def check(p: Params) -> None:
        assert p.label == "x" and p.dynamics.weights.shape == (3, 3)

    _run(
        structs(
            Params, sizes=3, label=st.just("x"), **{"dynamics.weights": st.just(jnp.ones((3, 3)))}
        ),
        check,
    )


def test_unknown_nested_field_is_named() -> None:
    """A path to no field is a TypeError naming the path's struct and its fields."""
    with pytest.raises(
        TypeError, match=r"structs\(Params\): in the overrides of fields inside 'initial'.*'covv'"
    ):
        structs(Params, **{"initial.covv": st.just(1)})


def test_path_through_a_non_struct_field_is_refused() -> None:
    """A path through a field that is not annotated with a struct class is a TypeError."""
    with pytest.raises(TypeError, match=r"'label.upper' overrides a field inside 'label'"):
        structs(Params, **{"label.upper": st.just("x")})


def test_whole_and_part_overrides_conflict() -> None:
    """Overriding 'initial' and 'initial.cov' together is refused: one would be ignored."""
    with pytest.raises(TypeError, match=r"both 'initial' and 'initial\.cov' are overridden"):
        structs(Params, initial=st.nothing(), **{"initial.cov": st.just(jnp.eye(2))})


def test_unknown_head_of_a_path_is_named() -> None:
    """A path whose first name is no field is refused like an unknown override."""
    with pytest.raises(TypeError, match=r"'nothing.cov' is not a field the constructor takes"):
        structs(Params, **{"nothing.cov": st.just(1)})
