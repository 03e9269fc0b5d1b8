"""Properties of the vmc package, written against jaxstruct.testing's public API.

Every test sets ``deadline=None``: the first example of each new shape and
dtype compiles under ``jax.jit``, which alone can exceed Hypothesis' default
200 ms deadline.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import jastrows, samplers, spin_samplers, train_states
from vmc import Jastrow, Model, SamplerState, TrainState, train_step

Check = Callable[..., None]


def advanced_by(new: jax.Array, old: jax.Array) -> int:
    """How far an integer counter moved, wrapping around its dtype."""
    bits = 8 * np.dtype(old.dtype).itemsize
    return (int(new) - int(old)) % 2**bits


@settings(max_examples=15, deadline=None)
@given(state=train_states)
def test_train_state_round_trips(
    state: TrainState, assert_roundtrip: Check, assert_pytree_roundtrip: Check
) -> None:
    """Exports and pytree flattening give the state back, typed key and counters included."""
    assert_roundtrip(state, formats=["state_dict", "zip"], strict=True)
    assert_pytree_roundtrip(state)


@settings(max_examples=15, deadline=None)
@given(samplers, st.integers(0, 2**32 - 1))
def test_replace_changes_only_what_it_names(state: SamplerState, seed: int) -> None:
    """replace(key=...) changes the key alone; a chains shape that breaks the tie is refused."""
    moved = state.replace(key=jax.random.key(seed))
    assert js.tree_equal(moved.chains, state.chains) and moved.n_chains == state.n_chains
    assert moved.replace(key=state.key) == state  # == compares the typed keys too
    with pytest.raises(js.ValidationError, match="n_chains, n_sites"):
        state.replace(n_chains=state.n_chains + 1)


@settings(max_examples=15, deadline=None)
@given(train_states)
def test_jitted_step_keeps_the_invariants(state: TrainState) -> None:
    """Under jit a step keeps shapes, dtypes and spins, advances the key and counts."""
    new = jax.jit(train_step)(state)
    old_sampler, sampler = state.sampler, new.sampler
    assert jax.tree.structure(new) == jax.tree.structure(state)  # static fields too
    assert sampler.chains.shape == old_sampler.chains.shape
    assert sampler.accepted.dtype == old_sampler.accepted.dtype
    assert bool(jnp.all(jnp.abs(sampler.chains) == 1))
    assert sampler.key != old_sampler.key  # typed keys compare by key data
    # Counters wrap around their dtype (int32 max + 1 is int32 min), as integers do in JAX.
    assert advanced_by(sampler.accepted, old_sampler.accepted) <= state.sampler.n_chains
    assert advanced_by(new.step, state.step) == 1


@settings(max_examples=15, deadline=None)
@given(st.from_type(Model), st.data())
def test_log_psi_vmaps_row_by_row(model: Model, data: st.DataObject) -> None:
    """log_psi of a batch is log_psi of each row (vmap agrees with batching)."""
    sampler = data.draw(spin_samplers(model.n_sites))
    batched = np.asarray(model.log_psi(sampler.chains))
    rows = np.asarray(jax.vmap(model.log_psi)(sampler.chains))
    np.testing.assert_allclose(rows, batched, rtol=1e-5, atol=1e-5, equal_nan=True)


@settings(max_examples=15, deadline=None)
@given(jastrows, st.data())
def test_jastrow_is_even_under_global_spin_flip(model: Jastrow, data: st.DataObject) -> None:
    """A real property of the model: flipping every spin leaves a Jastrow amplitude unchanged."""
    x = data.draw(spin_samplers(model.n_sites)).chains
    assert bool(jnp.array_equal(model.log_psi(-x), model.log_psi(x), equal_nan=True))


@settings(max_examples=15, deadline=None)
@given(train_states)
def test_sweep_is_deterministic_given_the_key(state: TrainState) -> None:
    """The same state and key give the same sweep (all randomness comes from the key)."""
    first = jax.jit(train_step)(state)
    again = jax.jit(train_step)(state)
    assert first == again
