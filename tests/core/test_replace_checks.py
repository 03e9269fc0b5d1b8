"""replace() checks what it changes; a check that reads a traced value says how to fix it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from jaxstruct.core.constraints import positive_definite

CALLS: list[str] = []


def _unit(w: jax.Array) -> bool:
    """A validator reading values (np.asarray): fine on concrete arrays, not on tracers."""
    CALLS.append("weights")
    return bool(np.all(np.abs(np.asarray(w)) <= 1))


def _any(x: object) -> bool:
    CALLS.append("cov")
    return True


class Dynamics(js.Struct):
    weights: jax.Array = js.field(validator=_unit)
    cov: jax.Array = js.field(validator=[_any, positive_definite])


def _dynamics() -> Dynamics:
    return Dynamics(weights=jnp.zeros((2, 2)), cov=jnp.eye(2))


def test_replace_skips_the_validators_of_unchanged_fields() -> None:
    """replace(cov=...) runs cov's validators, not those of weights (checked when built)."""
    d = _dynamics()
    CALLS.clear()
    d.replace(cov=2 * d.cov)
    assert CALLS == ["cov"]


def test_replace_still_refuses_a_bad_change() -> None:
    """The changed field's validators run, and refuse a bad value."""
    with pytest.raises(js.ValidationError, match=r"Dynamics\.weights"):
        _dynamics().replace(weights=jnp.full((2, 2), 3.0))


def test_replace_under_jit_leaves_unchanged_fields_alone() -> None:
    """Under jit, replacing cov does not run weights' value-reading validator on a tracer."""
    d = _dynamics()
    out = jax.jit(lambda d: d.replace(cov=d.cov * 2))(d)
    assert float(out.cov[1, 1]) == 2.0


def test_validator_reading_a_tracer_raises_traced_check_error() -> None:
    """A validator that cannot run on a traced value raises TracedCheckError, with the fix."""
    d = _dynamics()
    with pytest.raises(js.TracedCheckError) as info:
        jax.jit(lambda d: d.replace(weights=d.weights * 2))(d)
    message = str(info.value)
    assert message.startswith(
        "Dynamics.weights: validator '_unit' cannot run on a traced value "
        "(TracerArrayConversionError)."
    )
    assert "isinstance(w, jax.core.Tracer)" in message
    assert "jaxstruct.core.constraints" in message
    assert isinstance(info.value, TypeError)


def test_traced_check_error_is_no_refusal() -> None:
    """refusal_of() does not report a validator that met a tracer as refusing the value."""
    d = _dynamics()
    with pytest.raises(js.TracedCheckError) as info:
        jax.jit(lambda d: d.replace(weights=d.weights * 2))(d)
    assert js.refusal_of(info.value) is None
    assert not isinstance(info.value, js.ValidationError)


def test_validator_returning_a_traced_bool_raises_traced_check_error() -> None:
    """A validator written with jnp returns a traced bool under jit: no value to judge."""

    class Positive(js.Struct):
        x: jax.Array = js.field(validator=lambda x: jnp.all(x > 0))

    assert Positive(x=jnp.ones(2)).x.shape == (2,)
    with pytest.raises(js.TracedCheckError, match=r"Positive\.x: validator"):
        jax.jit(lambda x: Positive(x=x))(jnp.ones(2))


def test_check_init_reading_a_tracer_raises_traced_check_error() -> None:
    """__check_init__ comparing traced values raises TracedCheckError, not a refusal."""

    class Ordered(js.Struct):
        lo: jax.Array
        hi: jax.Array

        def __check_init__(self) -> None:
            if self.lo > self.hi:
                raise ValueError("lo > hi")

    o = Ordered(lo=jnp.float32(0), hi=jnp.float32(1))
    with pytest.raises(js.TracedCheckError, match=r"Ordered: .*__check_init__ cannot run") as info:
        jax.jit(lambda o: o.replace(hi=o.hi + 1))(o)
    assert js.refusal_of(info.value) is None


def test_post_init_change_is_validated_again() -> None:
    """A field __post_init__ assigns anew is validated, though replace did not name it."""

    class Clipped(js.Struct):
        x: float
        y: float = js.field(validator=lambda y: y <= 1)

        def __post_init__(self) -> None:
            self.y = self.x * 2

    c = Clipped(x=0.25, y=0.0)
    with pytest.raises(js.ValidationError, match=r"Clipped\.y"):
        c.replace(x=1.0)


def test_replace_of_an_unflattened_instance_checks_only_the_change() -> None:
    """tree_map's output was never validated; replace checks what it changes, nothing else."""
    d = _dynamics()
    scaled = jax.tree.map(lambda x: x * 10, d)  # unflatten runs no checks: weights now 0, cov 10
    CALLS.clear()
    assert float(scaled.replace(cov=jnp.eye(2)).weights[0, 0]) == 0.0
    assert CALLS == ["cov"]
