"""Checks of field values that the class enforces and ``jaxstruct.testing`` draws values for.

Use one as a validator, ``js.field(validator=positive_definite)``, or as
``Annotated`` metadata, ``cov: Annotated[Float[Array, "n n"], positive_definite]``:
either way the class refuses a bad value with a
:class:`~jaxstruct.core.ValidationError` naming the field, and
``jaxstruct.testing.structs()`` draws values that satisfy it (never by
filtering). Array checks apply to every element, to the last two axes or to
the last axis, so leading batch axes are fine; under ``jax.jit`` only what the
shape says is checked.

Example:
    >>> from typing import Annotated
    >>> import numpy as np
    >>> import jaxstruct.core as js
    >>> from jaxstruct.core.constraints import positive_definite, simplex
    >>> class Mixture(js.Struct):
    ...     weights: np.ndarray = js.field(validator=simplex)
    ...     cov: Annotated[np.ndarray, positive_definite]
    >>> m = Mixture(weights=np.array([0.25, 0.75]), cov=np.eye(2))
    >>> Mixture(weights=m.weights, cov=-np.eye(2))  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    jaxstruct.core._errors.ValidationError: Mixture.cov: positive_definite refused float64[2,2]:
    is not positive definite (smallest eigenvalue -1); pass a value it accepts
"""

from ._constraints import (
    Bounded,
    Constraint,
    Finite,
    PositiveDefinite,
    Simplex,
    Symmetric,
    bounded,
    finite,
    nonnegative,
    positive,
    positive_definite,
    simplex,
    symmetric,
)

__all__ = [
    "Bounded",
    "Constraint",
    "Finite",
    "PositiveDefinite",
    "Simplex",
    "Symmetric",
    "bounded",
    "finite",
    "nonnegative",
    "positive",
    "positive_definite",
    "simplex",
    "symmetric",
]
