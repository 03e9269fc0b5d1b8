"""Code that type checkers must accept: Struct subclasses are frozen dataclass-like classes."""

import dataclasses
from typing import ClassVar, assert_type

import jax.numpy as jnp
import jaxstruct.core as js


class TrainState(js.Struct):
    params: jnp.ndarray
    step: int = js.field(static=True, default=0)
    tag: str = js.field(static=True, default="run")
    n: int = js.field(static=True, init=False, derived=lambda self: 1)
    history: list[int] = js.field(default_factory=list)
    seed: int = js.field(static=True, kw_only=True, default=0)
    registry: ClassVar[dict[str, int]] = {}


class Config(js.Struct):
    # A static field without default is a required constructor parameter.
    n_layers: int = js.field(static=True)
    lr: float = 1e-3


state = TrainState(jnp.ones(3))
state = TrainState(params=jnp.ones(3), step=1, tag="x", history=[1], seed=3)
assert_type(state.step, int)
assert_type(state.tag, str)
assert_type(state.n, int)
assert_type(state.replace(step=2), TrainState)

config = Config(n_layers=2)
config = Config(3, 0.1)
assert_type(config.n_layers, int)
assert_type(config.lr, float)


@js.register_class
class Params:
    weights: jnp.ndarray
    scale: float = js.field(static=True, default=1.0)

    def norm(self) -> jnp.ndarray:
        return jnp.sum(self.weights) * self.scale


params = Params(weights=jnp.ones(4))
assert_type(params.scale, float)
assert_type(params.norm(), jnp.ndarray)


@js.register_class(name="Renamed")
class Named:
    x: int = 0


assert_type(Named(x=1).x, int)


@js.dataclass
class MyConfig:
    lr: float = js.field(static=True, default=1e-3)


assert_type(MyConfig(lr=0.1).lr, float)


class Ported(js.Struct):
    """Declared with the stdlib dataclasses.field, as code ported from flax.struct is."""

    torques: list[float] = dataclasses.field(default_factory=list)
    n_links: int = dataclasses.field(default=2, metadata={"pytree_node": False})
    cache: int = dataclasses.field(default=0, init=False)


ported = Ported()
ported = Ported(torques=[1.0], n_links=3)
assert_type(ported.n_links, int)
