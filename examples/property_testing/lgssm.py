"""A linear-Gaussian state-space model, its parameters as structs, and its Kalman filter.

The parameters follow dynamax's ``ParamsLGSSM``: an initial distribution, the
dynamics and the emissions, each a struct of means, weights, biases and
covariances. Every value says what it must satisfy in its annotation (with
``jaxstruct.core.constraints``), so the classes refuse bad parameters and
``jaxstruct.testing.structs()`` draws good ones with no strategy written by
hand. The sizes are the arrays' named sizes: ``state``, ``emission``,
``input`` (covariates) and ``t`` (time steps); ``ParamsLGSSM`` derives them,
as static fields, and checks that every shape follows them.

    z_1 ~ N(initial.mean, initial.cov)
    z_t = F z_{t-1} + B u_t + b + N(0, Q)  (F, B, b, Q: dynamics.weights, input_weights, bias, cov)
    y_t = H z_t + D u_t + d + N(0, R)      (H, D, d, R: the same of the emissions)
"""

# jaxtyping shape strings are not forward references, whatever F722 thinks.
# ruff: noqa: F722
from __future__ import annotations

from typing import Annotated

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
from jaxstruct.core.constraints import bounded, positive_definite
from jaxtyping import Array, Float


class Initial(js.Struct):
    """The distribution of the first state."""

    mean: Annotated[Float[Array, " state"], bounded(-5, 5)]
    cov: Annotated[Float[Array, "state state"], positive_definite]


class Dynamics(js.Struct):
    """How a state follows the one before: ``z_t = F z_{t-1} + B u_t + b + noise``."""

    weights: Annotated[Float[Array, "state state"], bounded(-1, 1)]
    bias: Annotated[Float[Array, " state"], bounded(-5, 5)]
    input_weights: Annotated[Float[Array, "state input"], bounded(-1, 1)]
    cov: Annotated[Float[Array, "state state"], positive_definite]


class Emissions(js.Struct):
    """How an emission follows its state: ``y_t = H z_t + D u_t + d + noise``."""

    weights: Annotated[Float[Array, "emission state"], bounded(-1, 1)]
    bias: Annotated[Float[Array, " emission"], bounded(-5, 5)]
    input_weights: Annotated[Float[Array, "emission input"], bounded(-1, 1)]
    cov: Annotated[Float[Array, "emission emission"], positive_definite]


class ParamsLGSSM(js.Struct):
    """The parameters of a linear-Gaussian SSM; its sizes are derived (static) fields."""

    initial: Initial
    dynamics: Dynamics
    emissions: Emissions
    state_dim: int = js.field(
        static=True, init=False, derived=lambda self: self.initial.mean.shape[-1]
    )
    emission_dim: int = js.field(
        static=True, init=False, derived=lambda self: self.emissions.bias.shape[-1]
    )
    input_dim: int = js.field(
        static=True, init=False, derived=lambda self: self.dynamics.input_weights.shape[-1]
    )

    def __check_init__(self) -> None:
        n, m, k = self.state_dim, self.emission_dim, self.input_dim
        expected = {
            "initial.cov": (n, n),
            "dynamics.weights": (n, n),
            "dynamics.bias": (n,),
            "dynamics.input_weights": (n, k),
            "dynamics.cov": (n, n),
            "emissions.weights": (m, n),
            "emissions.input_weights": (m, k),
            "emissions.cov": (m, m),
        }
        for path, shape in expected.items():
            part, name = path.split(".")
            actual = getattr(getattr(self, part), name).shape
            if actual != shape:
                raise ValueError(
                    f"{path} has shape {actual}, expected {shape} "
                    f"(state_dim={n}, emission_dim={m}, input_dim={k})"
                )


class Sequence(js.Struct):
    """Parameters with emissions and inputs of ``t`` steps: drawn together, sizes shared."""

    params: ParamsLGSSM
    emissions: Annotated[Float[Array, "t emission"], bounded(-10, 10)]
    inputs: Annotated[Float[Array, "t input"], bounded(-1, 1)]


class Gaussian(js.Struct):
    """A belief about the state: a mean and a covariance."""

    mean: Float[Array, " state"]
    cov: Annotated[Float[Array, "state state"], positive_definite]


def _log_normal(y: jax.Array, mean: jax.Array, cov: jax.Array) -> jax.Array:
    """log N(y; mean, cov) for a symmetric positive-definite ``cov``."""
    chol = jnp.linalg.cholesky(cov)
    white = jax.scipy.linalg.solve_triangular(chol, y - mean, lower=True)
    half_logdet = jnp.sum(jnp.log(jnp.diagonal(chol)))
    return -0.5 * (white @ white) - half_logdet - 0.5 * y.shape[-1] * jnp.log(2 * jnp.pi)


def predict(params: ParamsLGSSM, belief: Gaussian | Initial, u: jax.Array) -> Gaussian:
    """The belief about the next state: ``F m + B u + b`` and ``F P Fᵀ + Q``."""
    dyn = params.dynamics
    mean = dyn.weights @ belief.mean + dyn.input_weights @ u + dyn.bias
    cov = dyn.weights @ belief.cov @ dyn.weights.T + dyn.cov
    return Gaussian(mean=mean, cov=cov)


def condition(
    params: ParamsLGSSM, mean: jax.Array, cov: jax.Array, y: jax.Array, u: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Condition the state on one emission; return the new mean, cov and log N(y)."""
    em = params.emissions
    y_mean = em.weights @ mean + em.input_weights @ u + em.bias
    s = em.weights @ cov @ em.weights.T + em.cov
    gain = jnp.linalg.solve(s, em.weights @ cov).T
    new_mean = mean + gain @ (y - y_mean)
    new_cov = cov - gain @ s @ gain.T
    return new_mean, (new_cov + new_cov.T) / 2, _log_normal(y, y_mean, s)


@jax.jit
def log_likelihood(params: ParamsLGSSM, emissions: jax.Array, inputs: jax.Array) -> jax.Array:
    """The log-likelihood of the emissions: a Kalman filter, one ``lax.scan`` over time."""

    def step(carry: tuple[jax.Array, jax.Array, jax.Array], at: tuple[jax.Array, ...]):
        mean, cov, total = carry
        y, u, u_next = at
        mean, cov, ll = condition(params, mean, cov, y, u)
        belief = predict(params, Gaussian(mean=mean, cov=cov), u_next)
        return (belief.mean, belief.cov, total + ll), None

    start = (params.initial.mean, params.initial.cov, jnp.zeros((), params.initial.mean.dtype))
    # The dynamics apply between steps: the input of step t + 1 moves z_t to z_{t+1}.
    next_inputs = jnp.concatenate([inputs[1:], jnp.zeros_like(inputs[:1])])
    (_, _, total), _ = jax.lax.scan(step, start, (emissions, inputs, next_inputs))
    return total


def dense_log_likelihood(
    params: ParamsLGSSM, emissions: jax.Array | np.ndarray, inputs: jax.Array | np.ndarray
) -> float:
    """The same log-likelihood from the joint Gaussian of all emissions (NumPy, float64).

    A reference written another way: the mean and covariance of the stacked
    emissions ``y_1..y_T``, and one multivariate normal density.
    """
    p = {
        name: {f: np.asarray(getattr(getattr(params, name), f), np.float64) for f in fields}
        for name, fields in (
            ("initial", ("mean", "cov")),
            ("dynamics", ("weights", "bias", "input_weights", "cov")),
            ("emissions", ("weights", "bias", "input_weights", "cov")),
        )
    }
    ys = np.asarray(emissions, np.float64)
    us = np.asarray(inputs, np.float64)
    steps, m = ys.shape
    if steps == 0 or m == 0:
        return 0.0
    dyn, em = p["dynamics"], p["emissions"]
    means = [p["initial"]["mean"]]
    covs = [p["initial"]["cov"]]  # Cov(z_t, z_t)
    for t in range(1, steps):
        means.append(dyn["weights"] @ means[-1] + dyn["input_weights"] @ us[t] + dyn["bias"])
        covs.append(dyn["weights"] @ covs[-1] @ dyn["weights"].T + dyn["cov"])
    joint = np.zeros((steps * m, steps * m))
    for s in range(steps):
        for t in range(s, steps):
            # Cov(z_t, z_s) = F^(t-s) Cov(z_s, z_s)
            cross = np.linalg.matrix_power(dyn["weights"], t - s) @ covs[s]
            block = em["weights"] @ cross @ em["weights"].T
            if s == t:
                block = block + em["cov"]
            joint[t * m : (t + 1) * m, s * m : (s + 1) * m] = block
            joint[s * m : (s + 1) * m, t * m : (t + 1) * m] = block.T
    mean = np.concatenate(
        [em["weights"] @ means[t] + em["input_weights"] @ us[t] + em["bias"] for t in range(steps)]
    )
    resid = ys.reshape(-1) - mean
    _, logdet = np.linalg.slogdet(joint)
    return float(
        -0.5 * resid @ np.linalg.solve(joint, resid)
        - 0.5 * logdet
        - 0.5 * steps * m * np.log(2 * np.pi)
    )
