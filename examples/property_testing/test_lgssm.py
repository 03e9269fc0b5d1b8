"""Property tests of the linear-Gaussian SSM, with no strategy written by hand.

``structs(Sequence)`` draws parameters and sequences from the annotations
alone: covariances positive definite, weights and biases inside their
bounds, every shape following the named sizes (so ``ParamsLGSSM``'s
``__check_init__`` never refuses a draw). The planted bugs below are each
caught; the transposed weight's failing example shrinks to a 2x2 weight, and
the time it took is shown in the test summary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest
from hypothesis import given, settings
from hypothesis.reporting import with_reporter
from jaxstruct.testing import structs
from lgssm import (
    Gaussian,
    Initial,
    ParamsLGSSM,
    Sequence,
    dense_log_likelihood,
    log_likelihood,
    predict,
)
from timings import report

#: Every drawn sequence; float32 (a Kalman filter in bfloat16 is another test).
SEQUENCES = structs(Sequence, dtypes="float32")


def agrees(filtered: float, dense: float) -> bool:
    """The filter's float32 log-likelihood against the float64 reference."""
    return math.isclose(filtered, dense, rel_tol=1e-3, abs_tol=1e-2)


@settings(deadline=None)
@given(SEQUENCES)
def test_kalman_filter_matches_the_joint_gaussian(seq: Sequence) -> None:
    """The jitted Kalman filter's log-likelihood is that of the joint Gaussian of all emissions."""
    got = float(log_likelihood(seq.params, seq.emissions, seq.inputs))
    want = dense_log_likelihood(seq.params, seq.emissions, seq.inputs)
    assert agrees(got, want), (got, want)


@settings(deadline=None)
@given(structs(Sequence, dtypes="float32", sizes=2))  # one shape: inflate compiles once
def test_parameters_update_under_jit(seq: Sequence) -> None:
    """A jitted replace of one covariance keeps the struct valid and the rest untouched."""

    @jax.jit
    def inflate(params: ParamsLGSSM) -> ParamsLGSSM:
        dynamics = params.dynamics.replace(cov=params.dynamics.cov * 2)
        return params.replace(dynamics=dynamics)

    new = inflate(seq.params)
    assert new.state_dim == seq.params.state_dim
    assert jnp.array_equal(new.dynamics.weights, seq.params.dynamics.weights)


def caught(test: Callable[[], None], kind: type[BaseException]) -> str:
    """Run a Hypothesis test expected to fail with ``kind``; return all it printed."""
    lines: list[str] = []
    with with_reporter(lambda value: lines.append(str(value))), pytest.raises(kind) as info:
        test()
    return "\n".join([str(info.value), *lines, *getattr(info.value, "__notes__", [])])


@pytest.fixture
def plant(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, object], None]]:
    """Replace a function of lgssm by a buggy one; the jitted filter is traced anew with it."""
    import lgssm

    def planted(name: str, buggy: object) -> None:
        monkeypatch.setattr(lgssm, name, buggy)
        jax.clear_caches()

    yield planted
    jax.clear_caches()  # no later test may reuse a trace of the bug


def test_a_transposed_dynamics_weight_shrinks_to_two_by_two(
    plant: Callable[[str, object], None],
) -> None:
    """F.T instead of F: caught, and the failing example shrinks to the smallest F, 2x2."""

    def transposed(params: ParamsLGSSM, belief: Gaussian | Initial, u: jax.Array) -> Gaussian:
        dyn = params.dynamics
        mean = dyn.weights.T @ belief.mean + dyn.input_weights @ u + dyn.bias  # the bug
        cov = dyn.weights @ belief.cov @ dyn.weights.T + dyn.cov
        return Gaussian(mean=mean, cov=cov)

    plant("predict", transposed)
    shrunk: list[Sequence] = []

    # Derandomized: the same examples every run, so the shrink is too.
    @settings(deadline=None, database=None, max_examples=200, derandomize=True)
    @given(SEQUENCES)
    def property_filter(seq: Sequence) -> None:
        got = float(log_likelihood(seq.params, seq.emissions, seq.inputs))
        if not agrees(got, dense_log_likelihood(seq.params, seq.emissions, seq.inputs)):
            shrunk.append(seq)
            raise AssertionError(f"log-likelihood {got} disagrees with the joint Gaussian's")

    start, cpu = time.perf_counter(), time.process_time()
    printed = caught(property_filter, AssertionError)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    minimal = shrunk[-1].params  # Hypothesis runs the shrunk example last
    assert minimal.dynamics.weights.shape == (2, 2), minimal.dynamics.weights.shape
    assert "disagrees with the joint Gaussian" in printed
    report(
        f"transposed dynamics weight: found and shrunk to a {minimal.dynamics.weights.shape} "
        f"weight (emission_dim={minimal.emission_dim}, t={shrunk[-1].emissions.shape[0]}) "
        f"in {wall:.1f} s ({cpu:.1f} s of CPU)"
    )


def test_a_dropped_emission_bias(plant: Callable[[str, object], None]) -> None:
    """An emission mean without its bias: caught with a bias the shrinker keeps non-zero."""
    import lgssm

    real = lgssm.condition

    def unbiased(params: ParamsLGSSM, *belief_and_data: jax.Array) -> tuple[jax.Array, ...]:
        emissions = params.emissions.replace(bias=jnp.zeros_like(params.emissions.bias))
        return real(params.replace(emissions=emissions), *belief_and_data)  # the bug

    plant("condition", unbiased)

    @settings(deadline=None, database=None, max_examples=10)
    @given(structs(Sequence, dtypes="float32", sizes=1))  # one shape: one compilation
    def property_filter(seq: Sequence) -> None:
        got = float(lgssm.log_likelihood(seq.params, seq.emissions, seq.inputs))
        assert agrees(got, dense_log_likelihood(seq.params, seq.emissions, seq.inputs))

    printed = caught(property_filter, AssertionError)
    assert "bias=jnp.asarray([" in printed  # the shrunk bias, by value


def test_a_predicted_covariance_missing_its_transpose() -> None:
    """F P instead of F P Fᵀ: the Gaussian refuses the covariance, naming the field."""

    def forgetful(params: ParamsLGSSM, belief: Gaussian | Initial, u: jax.Array) -> Gaussian:
        dyn = params.dynamics
        mean = dyn.weights @ belief.mean + dyn.input_weights @ u + dyn.bias
        return Gaussian(mean=mean, cov=dyn.weights @ belief.cov + dyn.cov)  # the bug

    @settings(deadline=None, database=None, max_examples=10)
    @given(structs(Sequence, dtypes="float32", sizes=2))
    def property_predict(seq: Sequence) -> None:
        params = seq.params
        u = jnp.zeros(params.input_dim, jnp.float32)
        assert forgetful(params, params.initial, u).cov.shape == params.initial.cov.shape

    printed = caught(property_predict, js.ValidationError)
    assert "Gaussian.cov: positive_definite refused float32[2,2]: is not " in printed


def test_the_correct_prediction_is_a_valid_gaussian() -> None:
    """The filter's own prediction step always gives a valid belief (no refusal)."""

    @settings(deadline=None, database=None)
    @given(structs(Sequence, dtypes="float32", sizes=(1, 3)))
    def property_predict(seq: Sequence) -> None:
        params = seq.params
        belief = predict(params, params.initial, jnp.zeros(params.input_dim, jnp.float32))
        assert belief.cov.shape == params.initial.cov.shape

    property_predict()
