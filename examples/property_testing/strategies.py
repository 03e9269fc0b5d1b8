"""Hypothesis strategies for the vmc package, from jaxstruct.testing's public API only.

No ``st.composite``: dependent fields are overrides that are functions of the
fields they depend on, and named sizes are bound to the int fields that
state them. Sizes come from a few values and arrays are float32, so code under
``jax.jit`` compiles a handful of times, not once per example.
"""

from __future__ import annotations

import jax.numpy as jnp
from hypothesis import strategies as st
from jaxstruct.testing import arrays, structs
from jaxtyping import Array, Float
from vmc import Jastrow, Rbm, SamplerState, TrainState

#: The few sizes drawn: each (n_chains, n_sites) pair is one jit compilation.
SITES = (1, 3)
CHAINS = (2, 3)
#: One float and one int dtype: a new dtype is a new compilation too.
DTYPES = ("float32", "int32")


def weights(**sizes: int) -> st.SearchStrategy[jnp.ndarray]:
    """Float32 weights of the given named sizes, squashed into [-1, 1] (NaN stays NaN)."""
    dims = " ".join(sizes)
    return arrays(Float[Array, dims], sizes=sizes, dtypes="float32").map(jnp.tanh)


def spins(n_chains: int, n_sites: int) -> st.SearchStrategy[jnp.ndarray]:
    """Configurations of +1/-1 spins, one row per chain."""
    values = st.lists(st.sampled_from([1.0, -1.0]), min_size=n_chains * n_sites,
                      max_size=n_chains * n_sites)  # fmt: skip
    return values.map(lambda v: jnp.asarray(v, jnp.float32).reshape(n_chains, n_sites))


jastrows = structs(
    Jastrow,
    n_sites=st.sampled_from(SITES),
    params=lambda n_sites: st.fixed_dictionaries({"w": weights(i=n_sites, j=n_sites)}),
)
rbms = structs(
    Rbm,
    n_sites=st.sampled_from(SITES),
    alpha=st.sampled_from((1, 2)),
    params=lambda n_sites, alpha: st.fixed_dictionaries(
        {"a": weights(i=n_sites), "w": weights(i=n_sites, h=alpha * n_sites)}
    ),
)
# st.from_type(Model), and every field annotated Model (TrainState.model), now
# draw these: structs() resolves nested struct fields through st.from_type.
st.register_type_strategy(Jastrow, jastrows)
st.register_type_strategy(Rbm, rbms)

#: Any sampler state: every "chains"/"sites" dimension follows n_chains/n_sites.
samplers = structs(
    SamplerState,
    sizes={"chains": "n_chains", "sites": "n_sites"},
    dtypes=DTYPES,
    n_chains=st.sampled_from(CHAINS),
    n_sites=st.sampled_from(SITES),
)


def spin_samplers(
    n_sites: int | None = None, dtypes: tuple[str, ...] = DTYPES
) -> st.SearchStrategy[SamplerState]:
    """Sampler states whose chains hold +1/-1 spins (of ``n_sites`` sites when given)."""
    return structs(
        SamplerState,
        dtypes=dtypes,
        n_chains=st.sampled_from(CHAINS),
        n_sites=st.sampled_from(SITES) if n_sites is None else st.just(n_sites),
        chains=spins,  # a function of n_chains and n_sites: drawn after them
        temperature=st.just(1.0),  # a static field: each new value compiles jit code again
    )


def train_states_of(dtypes: tuple[str, ...] = DTYPES) -> st.SearchStrategy[TrainState]:
    """Train states whose sampler has as many sites as the model."""
    return structs(
        TrainState,
        dtypes=dtypes,
        sampler=lambda model: spin_samplers(model.n_sites, dtypes),
        learning_rate=st.just(0.01),  # static, like the temperature
    )


train_states = train_states_of()
