"""structs(): fields that depend on each other, stated without st.composite."""

import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxstruct.testing import arrays, structs
from jaxtyping import Array, Float


class Chains(js.Struct):
    # jaxtyping's shape strings are not forward references (F722 misreads them).
    chains: Float[Array, "chains sites"]  # noqa: F722
    weights: Float[Array, " chains"]  # noqa: F722
    n_chains: int = js.field(static=True, validator=lambda n: n > 0)
    n_sites: int = js.field(static=True, validator=lambda n: n > 0)

    def __check_init__(self) -> None:
        if self.chains.shape != (self.n_chains, self.n_sites):
            raise ValueError(f"chains {self.chains.shape} != ({self.n_chains}, {self.n_sites})")


@settings(max_examples=25, suppress_health_check=[])
@given(structs(Chains, sizes={"chains": "n_chains", "sites": "n_sites"}))
def test_named_sizes_bound_to_int_fields(c: Chains) -> None:
    """sizes={"chains": "n_chains"} makes every chains dimension the drawn n_chains."""
    assert c.chains.shape == (c.n_chains, c.n_sites)
    assert c.weights.shape == (c.n_chains,)
    assert c.n_chains > 0 and c.n_sites > 0


@settings(max_examples=25, suppress_health_check=[])
@given(
    structs(
        Chains,
        n_chains=st.integers(1, 4),
        n_sites=st.integers(1, 3),  # an int field left free could be 2**31 - 1 sites
        chains=lambda n_chains, n_sites: arrays(
            Float[Array, "a b"],
            sizes={"a": n_chains, "b": n_sites},
        ),
        weights=lambda n_chains: st.just(jnp.ones(n_chains)),
    )
)
def test_overrides_may_be_functions_of_other_fields(c: Chains) -> None:
    """An override whose parameters name fields gets their values, drawn before it."""
    assert c.chains.shape == (c.n_chains, c.n_sites)
    assert np.all(np.asarray(c.weights) == 1) and 1 <= c.n_chains <= 4


def test_dependent_override_errors_name_the_problem() -> None:
    """Unknown dependencies, cycles and non-strategy results are TypeErrors."""
    with pytest.raises(TypeError, match=r"depends on 'n_chain'"):
        structs(Chains, chains=lambda n_chain: st.none())
    with pytest.raises(TypeError, match="cycle"):
        structs(Chains, n_chains=lambda n_sites: st.just(1), n_sites=lambda n_chains: st.just(1))
    with pytest.raises(TypeError, match=r"sizes=\{'chains': 'n_chain'\}"):
        structs(Chains, sizes={"chains": "n_chain"})


class Pair(js.Struct):
    x: Float[Array, "n m"]  # noqa: F722
    y: Float[Array, " n"]  # noqa: F722


@settings(max_examples=30)
@given(structs(Pair, x=st.just(jnp.zeros((2, 3)))))
def test_override_values_bind_named_sizes(p: Pair) -> None:
    """An override's shape binds the named sizes of the other fields (n == 2 here)."""
    assert p.y.shape == (2,)
