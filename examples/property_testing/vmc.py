"""A tiny variational Monte Carlo package: the code the property tests next to it check.

Spin configurations are rows of +1/-1 values. A ``Model`` gives the log
amplitude of a configuration; ``SamplerState`` holds a batch of Metropolis
chains and the typed PRNG key that drives them; ``TrainState`` ties a model
to its sampler.
"""

# jaxtyping shape strings are not forward references, whatever F722 thinks.
# ruff: noqa: F722
from __future__ import annotations

import abc
import enum
from typing import Literal

import jax
import jax.numpy as jnp
import jaxstruct.core as js
from jaxtyping import Array, Float, Int, Key


class Proposal(enum.Enum):
    """How a sweep proposes a new configuration."""

    FLIP = "flip"


def _positive(n: int) -> bool:
    return n > 0


class Model(js.Struct):
    """A wave function over ``n_sites`` spins."""

    n_sites: int = js.field(static=True, validator=_positive)

    @abc.abstractmethod
    def log_psi(self, x: Float[Array, "... sites"]) -> Float[Array, ...]:
        """The log amplitude of each configuration in ``x``."""


class Jastrow(Model):
    """``log psi(x) = x W x`` with a symmetric ``W`` (``params["w"]``, sites x sites)."""

    params: dict[str, Float[Array, "sites sites"]] = js.field(kw_only=True)

    def __check_init__(self) -> None:
        if set(self.params) != {"w"}:
            raise ValueError(f"Jastrow params must be {{'w'}}, got {sorted(self.params)}")
        if self.params["w"].shape != (self.n_sites, self.n_sites):
            raise ValueError(f"w must be ({self.n_sites}, {self.n_sites})")

    def log_psi(self, x: Float[Array, "... sites"]) -> Float[Array, ...]:
        w = self.params["w"]
        return jnp.einsum("...i,ij,...j->...", x, (w + w.T) / 2, x)


class Rbm(Model):
    """A restricted Boltzmann machine with ``alpha * n_sites`` hidden units."""

    params: dict[str, Float[Array, ...]] = js.field(kw_only=True)
    alpha: int = js.field(static=True, default=1, validator=_positive)
    n_hidden: int = js.field(
        static=True, init=False, derived=lambda self: self.alpha * self.n_sites
    )

    def __check_init__(self) -> None:
        if set(self.params) != {"a", "w"}:
            raise ValueError(f"Rbm params must be {{'a', 'w'}}, got {sorted(self.params)}")
        if self.params["a"].shape != (self.n_sites,):
            raise ValueError(f"a must be ({self.n_sites},)")
        if self.params["w"].shape != (self.n_sites, self.n_hidden):
            raise ValueError(f"w must be ({self.n_sites}, {self.n_hidden})")

    def log_psi(self, x: Float[Array, "... sites"]) -> Float[Array, ...]:
        hidden = jnp.log(jnp.cosh(x @ self.params["w"])).sum(-1)
        return x @ self.params["a"] + hidden


class SamplerState(js.Struct):
    """Metropolis chains, one configuration per row, and the key of the next sweep."""

    chains: Float[Array, "chains sites"]
    key: Key[Array, ""]
    n_chains: int = js.field(static=True, validator=_positive)
    n_sites: int = js.field(static=True, validator=_positive)
    accepted: Int[Array, ""] = js.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    proposal: Proposal = js.field(static=True, default=Proposal.FLIP)
    mode: Literal["metropolis", "exact"] = js.field(static=True, default="metropolis")
    temperature: float = js.field(
        static=True, default=1.0, converter=float, validator=lambda t: 0 < t <= 100
    )

    def __post_init__(self) -> None:
        if self.chains.shape != (self.n_chains, self.n_sites):
            # A ValidationError: refusing a value on purpose (structs() discards such draws).
            raise js.ValidationError(
                f"SamplerState.chains: shape {self.chains.shape} != "
                f"(n_chains, n_sites) = ({self.n_chains}, {self.n_sites})"
            )


class TrainState(js.Struct):
    """A model, its sampler, and the optimisation step."""

    model: Model
    sampler: SamplerState
    step: Int[Array, ""] = js.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    learning_rate: float = js.field(static=True, default=0.01, validator=lambda lr: lr > 0)

    def __check_init__(self) -> None:
        if self.model.n_sites != self.sampler.n_sites:
            raise ValueError(
                f"model has {self.model.n_sites} sites, sampler {self.sampler.n_sites}"
            )


def sweep(state: SamplerState, model: Model) -> SamplerState:
    """One Metropolis step per chain: flip a random site, accept with the amplitude ratio."""
    key, pick, coin = jax.random.split(state.key, 3)
    rows = jnp.arange(state.n_chains)
    site = jax.random.randint(pick, (state.n_chains,), 0, state.n_sites)
    proposed = state.chains.at[rows, site].multiply(-1)
    log_ratio = 2 * (model.log_psi(proposed) - model.log_psi(state.chains))
    accept = jnp.log(jax.random.uniform(coin, (state.n_chains,))) < log_ratio / state.temperature
    chains = jnp.where(accept[:, None], proposed, state.chains)
    # Keep the counter's dtype: adding an int32 sum would promote an int8 counter.
    accepted = state.accepted + accept.sum().astype(state.accepted.dtype)
    return state.replace(chains=chains, key=key, accepted=accepted)


def train_step(state: TrainState) -> TrainState:
    """Advance the sampler by one sweep and count the step."""
    sampler = sweep(state.sampler, state.model)
    return state.replace(sampler=sampler, step=state.step + jnp.ones((), state.step.dtype))
