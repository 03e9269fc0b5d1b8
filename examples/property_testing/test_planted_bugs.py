"""Planted bugs: each is caught by a property test, with a readable shrunk example.

Each test below runs a property against code with a bug planted in it and
checks the failure names the cause: the tests pass when the bug is caught.
They are the kinds of bugs jaxstruct.testing is meant to surface: a key that
is not advanced, a dtype silently promoted, a bug in ``__post_init__``, state
left out of checkpoints, and fields that stop agreeing with each other.
"""

# jaxtyping shape strings are not forward references, whatever F722 thinks.
# ruff: noqa: F722
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.reporting import with_reporter
from jaxstruct.testing import assert_roundtrip, structs
from jaxtyping import Float, Int
from strategies import spin_samplers
from vmc import Jastrow, Model, SamplerState, sweep

#: One small model: the bugs are in the sampler, and fewer shapes mean fewer compilations.
MODEL = Jastrow(n_sites=2, params={"w": jnp.eye(2, dtype=jnp.float32)})


def caught(test: Callable[[], None], kind: type[BaseException]) -> str:
    """Run a Hypothesis test expected to fail with ``kind``; return all it printed."""
    lines: list[str] = []
    with with_reporter(lambda value: lines.append(str(value))), pytest.raises(kind) as info:
        test()
    return "\n".join([str(info.value), *lines, *getattr(info.value, "__notes__", [])])


def test_a_key_that_is_not_advanced() -> None:
    """A sweep that reuses its key draws the same numbers forever: the key must change."""

    def sweep_reusing_key(state: SamplerState, model: Model) -> SamplerState:
        return sweep(state, model).replace(key=state.key)  # the bug

    @settings(max_examples=20, deadline=None, database=None)
    @given(spin_samplers(n_sites=2))
    def property_key_advances(state: SamplerState) -> None:
        new = jax.jit(sweep_reusing_key)(state, MODEL)
        assert new.key != state.key, "the sweep did not advance the key"

    printed = caught(property_key_advances, AssertionError)
    assert "the sweep did not advance the key" in printed
    assert "key=key<fry>[](key data [" in printed  # the key itself, by value


def test_a_counter_silently_promoted() -> None:
    """Adding an int32 count to an int8 counter promotes it: found with int8 counters drawn."""

    def sweep_promoting(state: SamplerState, model: Model) -> SamplerState:
        new = sweep(state, model)
        return new.replace(accepted=state.accepted + jnp.sum(new.chains != state.chains))

    @settings(max_examples=30, deadline=None, database=None)
    @given(spin_samplers(n_sites=2, dtypes=("float32", "int8", "int32")))
    def property_counter_dtype(state: SamplerState) -> None:
        # Silent under JAX's default ("standard") promotion, which most users run;
        # jax_numpy_dtype_promotion="strict" would raise instead.
        with jax.numpy_dtype_promotion("standard"):
            new = jax.jit(sweep_promoting)(state, MODEL)
        assert new.accepted.dtype == state.accepted.dtype

    printed = caught(property_counter_dtype, AssertionError)
    assert "assert dtype('int32') == dtype('int8')" in printed
    assert "accepted=jnp.asarray(0, dtype=int8)" in printed


class Normalised(js.Struct):
    """Weights whose first entry is the reference: the user's ``__post_init__`` has a bug."""

    w: Int[np.ndarray, " n"]

    def __post_init__(self) -> None:
        if self.w[0] < 0:  # the bug: IndexError when w is empty
            raise js.ValidationError("Normalised.w: the first weight must be >= 0")


# Normalised refuses the draws whose first weight is negative, about half: on
# purpose here, so the end-of-test report of refused draws is not wanted.
@pytest.mark.filterwarnings("ignore::jaxstruct.testing.RefusalWarning")
def test_a_bug_in_post_init() -> None:
    """The user's IndexError fails the test with its traceback (it is not a refused draw)."""

    # Empty arrays are drawn rarely by default (most bugs need data); sizes=(0, 1, 2)
    # makes the edge case this bug needs a third of the draws, so 50 examples find it.
    @settings(max_examples=50, deadline=None, database=None)
    @given(structs(Normalised, sizes=(0, 1, 2), dtypes="int32"))
    def property_first_is_nonnegative(x: Normalised) -> None:
        assert x.w[0] >= 0

    printed = caught(property_first_is_nonnegative, IndexError)
    assert "index 0 is out of bounds" in printed


class Checkpointed(js.Struct):
    """A training counter that was marked serialize=False by mistake."""

    w: Float[np.ndarray, " n"]
    step: Int[np.ndarray, ""] = js.field(
        default_factory=lambda: np.zeros((), np.int32), serialize=False
    )


def test_state_left_out_of_checkpoints() -> None:
    """strict=True compares fields declared serialize=False: the lost step is reported."""

    @settings(max_examples=30, deadline=None, database=None)
    @given(structs(Checkpointed, sizes=2, dtypes=("float32", "int32")))
    def property_checkpoint_keeps_state(x: Checkpointed) -> None:
        assert_roundtrip(x, formats=["state_dict"], strict=True)

    printed = caught(property_checkpoint_keeps_state, AssertionError)
    assert "at x.step:" in printed and "serialize=False" in printed
    assert "step=np.asarray(" in printed  # the lost value, shown


def test_fields_that_stop_agreeing() -> None:
    """Thinning the chains without updating n_chains breaks the tie the class checks."""

    def thin(state: SamplerState) -> SamplerState:
        return state.replace(chains=state.chains[::2])  # the bug: n_chains is not halved

    @settings(max_examples=30, deadline=None, database=None)
    @given(spin_samplers())
    def property_thinning_keeps_a_valid_state(state: SamplerState) -> None:
        thin(state)

    printed = caught(property_thinning_keeps_a_valid_state, js.ValidationError)
    assert "SamplerState.chains: shape (1, " in printed and "n_chains=2" in printed
