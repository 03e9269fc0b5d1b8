"""A constructor or ``replace`` argument may be anything the field's converter accepts."""

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
from typing_extensions import assert_type


def to_int(value: str | int) -> int:
    return int(value)


class Counter(js.Struct):
    n: int = js.field(static=True, converter=to_int)
    values: jax.Array = js.field(converter=jnp.asarray)
    label: str = js.field(static=True, converter=lambda v: str(v), default="")


c = Counter(n="3", values=[1.0, 2.0], label=5)
Counter(3, np.ones(2))
assert_type(c.n, int)
assert_type(c.values, jax.Array)


class Child(Counter):
    extra: int = 0


Child(n="4", values=(1, 2), extra=1)
