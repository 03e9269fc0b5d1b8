"""Constraints type-check as validators and as ``Annotated`` metadata; the field keeps its type."""

from typing import Annotated

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
from jaxstruct.core.constraints import (
    Bounded,
    Constraint,
    bounded,
    finite,
    positive,
    positive_definite,
    simplex,
    symmetric,
)
from typing_extensions import assert_type


class Gaussian(js.Struct):
    mean: Annotated[jax.Array, finite]
    cov: Annotated[jax.Array, positive_definite]
    weights: jax.Array = js.field(validator=simplex)
    gram: np.ndarray = js.field(default_factory=lambda: np.eye(2), validator=[symmetric, finite])
    scale: float = js.field(default=1.0, validator=positive)
    rate: Annotated[float, bounded(0, 1, exclude_hi=True)] = 0.5


g = Gaussian(mean=jnp.zeros(2), cov=jnp.eye(2), weights=jnp.ones(2) / 2)
assert_type(g.cov, jax.Array)
assert_type(g.rate, float)
g.replace(rate=0.25)

unit: Bounded = bounded(-1, 1)
assert_type(unit.ge, float | None)
assert_type(positive_definite(np.eye(2)), bool)
assert_type(finite.explain(1.0), str | None)


class Unit(Constraint):
    def explain(self, value: object) -> str | None:
        return None


class Direction(js.Struct):
    v: np.ndarray = js.field(validator=Unit())
