"""Code that type checkers must reject; each offending line ends with ``# expected-error``."""

import dataclasses

import jax.numpy as jnp
import jaxstruct.core as js


class TrainState(js.Struct):
    params: jnp.ndarray
    step: int = js.field(static=True, default=0)
    n: int = js.field(static=True, init=False, derived=lambda self: 1)
    seed: int = js.field(static=True, kw_only=True, default=0)


class Config(js.Struct):
    n_layers: int = js.field(static=True)


state = TrainState(params=jnp.ones(3))
TrainState()  # expected-error
TrainState(params=jnp.ones(3), step="one")  # expected-error
TrainState(params=jnp.ones(3), n=2)  # expected-error
TrainState(params=jnp.ones(3), unknown=2)  # expected-error
TrainState(jnp.ones(3), 0, 1)  # expected-error
Config()  # expected-error
Config(n_layers="2")  # expected-error

state.step = 3  # expected-error
state.params = jnp.zeros(3)  # expected-error


@js.register_class
class Params:
    weights: jnp.ndarray
    scale: float = js.field(static=True, default=1.0)


Params(weights=jnp.ones(2), scale="big")  # expected-error
Params(weights=jnp.ones(2)).scale = 2.0  # expected-error


@js.dataclass
class MyConfig:
    lr: float = js.field(static=True, default=1e-3)


MyConfig(lr="fast")  # expected-error


class Ported(js.Struct):
    cache: int = dataclasses.field(default=0, init=False)
    n_links: int = dataclasses.field(default=2, metadata={"pytree_node": False})


Ported(cache=1)  # expected-error
Ported(n_links="2")  # expected-error
