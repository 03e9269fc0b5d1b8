"""``replace`` calls that type checkers must accept, typed as the receiver's class."""

from typing import TypeVar

import jax.numpy as jnp
import jaxstruct.core as js
from typing_extensions import assert_type


class Layer(js.Struct):
    w: jnp.ndarray
    act: str = js.field(static=True, default="relu")
    depth: int = js.field(static=True, kw_only=True, default=1)
    size: int = js.field(static=True, init=False, derived=lambda self: 1)


layer = Layer(w=jnp.ones(2))
assert_type(layer.replace(), Layer)
assert_type(layer.replace(act="tanh"), Layer)
assert_type(layer.replace(w=jnp.zeros(2), depth=3), Layer)


class Deeper(Layer):
    extra: float = 0.0


assert_type(Deeper(w=jnp.ones(2)).replace(extra=1.0, act="gelu"), Deeper)

S = TypeVar("S", bound=js.Struct)


def unchanged(obj: S) -> S:
    return obj.replace()


def relu(layer: Layer) -> Layer:
    return layer.replace(act="relu")


assert_type(unchanged(layer), Layer)
