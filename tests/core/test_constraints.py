"""jaxstruct.core.constraints: checks a class runs, as validators or as Annotated metadata."""

# String annotations on purpose: the Annotated constraints of a module written with
# postponed annotations are read when the class is created, as plain ones are.
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import ml_dtypes
import numpy as np
import pytest
from jaxstruct.core.constraints import (
    Constraint,
    bounded,
    finite,
    nonnegative,
    positive,
    positive_definite,
    simplex,
    symmetric,
)
from jaxtyping import Array, Float

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence  # names only type checkers see

# ruff: noqa: F722 (jaxtyping shape strings are not forward references)


class Gaussian(js.Struct):
    mean: Annotated[Float[Array, " n"], finite]
    cov: Annotated[Float[Array, "n n"], positive_definite]


class Mixture(js.Struct):
    weights: np.ndarray = js.field(validator=simplex)
    scale: float = js.field(default=1.0, validator=positive)


def _refusal(make: Callable[[], object]) -> tuple[js.ValidationError, js.Refusal]:
    with pytest.raises(js.ValidationError) as info:
        make()
    why = js.refusal_of(info.value)
    assert why is not None
    return info.value, why


def test_annotated_constraint_refuses_at_construction() -> None:
    """A constraint in Annotated metadata refuses a bad value, naming class, field and check."""
    err, why = _refusal(lambda: Gaussian(mean=jnp.zeros(2), cov=-jnp.eye(2)))
    assert (why.cls, why.field, why.check, why.hook) == (
        Gaussian,
        "cov",
        "validator",
        positive_definite,
    )
    assert str(err) == (
        "Gaussian.cov: positive_definite refused float32[2,2]: is not positive definite "
        "(smallest eigenvalue -1); pass a value it accepts"
    )


def test_annotated_constraint_accepts_good_values() -> None:
    """Good values pass the Annotated constraints (postponed annotations read at class creation)."""
    g = Gaussian(mean=jnp.zeros(2), cov=2 * jnp.eye(2))
    assert g.cov.shape == (2, 2)


def test_validator_constraint_refuses_with_its_explanation() -> None:
    """A constraint given as validator= says what is wrong with the value."""
    err, why = _refusal(lambda: Mixture(weights=np.array([0.5, 0.25])))
    assert why.field == "weights"
    assert "simplex refused float64[2]: has entries summing to 0.75, not 1" in str(err)


def test_field_validator_excludes_annotation_constraints() -> None:
    """FieldSpec.validator is what was declared; the annotation's constraints are in .annotated."""
    spec = js.fields(Gaussian)["cov"]
    assert spec.validator is None
    assert spec.annotated == (positive_definite,)
    assert spec.validators == (positive_definite,)


@pytest.mark.parametrize(
    ("constraint", "good", "bad", "reason"),
    [
        (
            finite,
            np.array([1.0, -2.0]),
            np.array([1.0, np.nan]),
            "has 1 of 2 elements NaN or infinite",
        ),
        (finite, 3.0, float("inf"), "is inf"),
        (
            bounded(0, 1),
            np.array([0.0, 1.0]),
            np.array([0.5, 1.5]),
            "has 1 of 2 elements outside [0, 1]",
        ),
        (bounded(0, 1, exclude_hi=True), 0.5, 1.0, "is 1, outside [0, 1)"),
        (positive, np.array([1e-9]), np.array([0.0]), "outside (0, inf)"),
        (nonnegative, 0, -1, "is -1, outside [0, inf)"),
        (symmetric, np.array([[1, 2], [2, 1]]), np.array([[1, 2], [3, 1]]), "is not symmetric"),
        (symmetric, np.eye(2), np.ones((2, 3)), "expected square matrices in the last two axes"),
        (positive_definite, np.eye(3), np.diag([1.0, 0.0, 1.0]), "is not positive definite"),
        (positive_definite, np.eye(2), np.array([[1.0, 0.5], [0.0, 1.0]]), "is not symmetric"),
        (positive_definite, np.eye(2), np.full((2, 2), np.nan), "has NaN or infinite entries"),
        (simplex, np.array([0.2, 0.8]), np.array([-0.2, 1.2]), "has negative entries"),
        (simplex, np.array([1.0]), np.zeros((0,)), "at least one entry"),
    ],
)
def test_each_constraint_accepts_and_explains(
    constraint: Constraint, good: object, bad: object, reason: str
) -> None:
    """Each built-in constraint accepts a good value and says why it refuses a bad one."""
    assert constraint(good) is True and constraint.explain(good) is None
    assert constraint(bad) is False
    why = constraint.explain(bad)
    assert why is not None and reason in why, why


def test_constraints_check_every_matrix_of_a_batch() -> None:
    """Leading batch axes: each matrix (or vector) of the batch is checked."""
    covs = np.stack([np.eye(2), 2 * np.eye(2), np.eye(2)])
    assert positive_definite(covs)
    covs[1, 0, 0] = -5
    assert not positive_definite(covs)
    rows = np.array([[0.5, 0.5], [1.0, 0.0], [0.3, 0.3]])
    assert not simplex(rows) and simplex(rows[:2])


def test_constraints_read_jax_and_low_precision_arrays() -> None:
    """JAX arrays and bfloat16/float16 values are checked, with rounding allowed for."""
    probs = (np.array([1.0, 1.0, 1.0]) / 3).astype(ml_dtypes.bfloat16)
    assert simplex(probs)
    assert simplex(jnp.asarray(probs))
    assert positive_definite(jnp.eye(3, dtype=jnp.float16))
    assert finite(jnp.array([1.0, 2.0])) and not finite(jnp.array([1.0, jnp.inf]))


def test_symmetric_allows_rounding_of_a_product() -> None:
    """A matrix computed as A @ B @ A.T is symmetric to rounding, and passes."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 4)).astype(np.float32)
    b = np.eye(4, dtype=np.float32) + 0.1
    product = a @ b @ a.T
    assert symmetric(product) and positive_definite(product + 4 * np.eye(4, dtype=np.float32))


def test_constraint_under_jit_checks_only_the_shape() -> None:
    """Traced values pass (values unknown until run); a wrong shape is refused under jit too."""

    @jax.jit
    def scaled(g: Gaussian, s: jax.Array) -> Gaussian:
        return g.replace(cov=g.cov * s)

    g = Gaussian(mean=jnp.zeros(2), cov=jnp.eye(2))
    assert float(scaled(g, jnp.float32(-1)).cov[0, 0]) == -1  # not checkable inside jit
    with pytest.raises(js.ValidationError, match="expected square matrices"):
        jax.jit(lambda g: g.replace(cov=g.cov[:, :1]))(g)


def test_redeclaring_a_field_keeps_its_annotation_constraints() -> None:
    """A subclass changing only the default keeps the constraints of the annotation."""

    class Base(js.Struct):
        rate: Annotated[float, bounded(0, 1)] = 0.5

    class Child(Base):
        rate: Annotated[float, bounded(0, 1)] = 0.25

    assert Child().rate == 0.25
    _, why = _refusal(lambda: Child(rate=2.0))
    assert (why.cls, why.field) == (Child, "rate")


class Holder(js.Struct):
    value: Annotated[Later, bounded(0, 1)]


Later = float  # defined after the class that names it


def test_forward_reference_in_annotated_is_read_at_first_check() -> None:
    """An Annotated annotation naming a class defined later is read when an instance is built."""
    assert Holder(value=0.5).value == 0.5
    err, _ = _refusal(lambda: Holder(value=3.0))
    assert "Holder.value: bounded(0, 1) refused 3.0: is 3, outside [0, 1]" in str(err)


def test_annotation_only_type_checkers_see_checks_nothing() -> None:
    """A name imported under TYPE_CHECKING: the annotation cannot be read, nothing is refused."""

    class Loose(js.Struct):
        values: Annotated[Sequence[float], finite]

    assert np.isnan(Loose(values=[float("nan")]).values[0])


def test_custom_constraint_is_a_validator() -> None:
    """A Constraint subclass works as a validator; its explanation is in the error."""

    class Unit(Constraint):
        name = "unit"

        def explain(self, value: object) -> str | None:
            norm = float(np.linalg.norm(np.asarray(value)))
            return None if abs(norm - 1) < 1e-6 else f"has norm {norm:.3g}"

    class Direction(js.Struct):
        v: np.ndarray = js.field(validator=Unit())

    assert Direction(v=np.array([0.6, 0.8])).v.shape == (2,)
    err, _ = _refusal(lambda: Direction(v=np.ones(2)))
    assert "Direction.v: unit refused float64[2]: has norm 1.41" in str(err)


def test_equal_constraints_compare_equal() -> None:
    """Constraints compare by kind and bounds (a redeclaration spelling them anew matches)."""
    assert bounded(0, 1) == bounded(0, 1) and hash(bounded(0, 1)) == hash(bounded(0, 1))
    assert bounded(0, 1) != bounded(0, 2) and finite != symmetric
    assert positive == bounded(0, exclude_lo=True) and repr(positive) == "positive"


def test_bounded_refuses_bad_bounds() -> None:
    """bounded() refuses bounds that are not numbers, and bounds with nothing between them."""
    with pytest.raises(TypeError, match="lo must be a number"):
        bounded("0", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no number lies between 1 and 0"):
        bounded(1, 0)


def test_bounded_reads_as_annotated_types_bounds() -> None:
    """bounded() answers ge/gt/le/lt as annotated_types spells them."""
    b = bounded(0, 1, exclude_hi=True)
    assert (b.ge, b.gt, b.le, b.lt) == (0, None, None, 1)
