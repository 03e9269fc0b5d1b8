"""Code mypy (with ``jaxstruct.core.mypy_plugin``) must reject: see accept_mypy_plugin.py.

typing-runs: mypy
"""

import jax.numpy as jnp
import jaxstruct.core as js
from jaxstruct.abc import AbstractVar


@js.register_class
class Params:
    weights: jnp.ndarray
    scale: float = js.field(static=True, default=1.0)


params = Params(weights=jnp.ones(2))
params.replace(scale="big")  # expected-error
params.replace(typo=1)  # expected-error
bad: str = params.replace()  # expected-error


class Base(js.Struct):
    w: float
    name: AbstractVar[str]


class ByProperty(Base):
    @property
    def name(self) -> str:
        return "p"


ByProperty(w=1.0, name="x")  # expected-error
ByProperty(w=1.0).name = "y"  # expected-error
