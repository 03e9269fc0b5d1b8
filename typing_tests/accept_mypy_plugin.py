"""Code mypy (with ``jaxstruct.core.mypy_plugin``) must accept: what pyright cannot express.

typing-runs: mypy

* a ``register_class`` class is a ``Struct`` (pyright: the decorator's type returns
  the class unchanged, so to pyright it has no ``replace``);
* an ``AbstractVar`` provided by a property (pyright counts the declaration as a
  dataclass field, as it does for equinox's ``AbstractVar``).
"""

import jax.numpy as jnp
import jaxstruct.core as js
from jaxstruct.abc import AbstractVar
from typing_extensions import assert_type


@js.register_class
class Params:
    weights: jnp.ndarray
    scale: float = js.field(static=True, default=1.0)


params = Params(weights=jnp.ones(2))
assert_type(params.replace(scale=2.0), Params)
assert_type(params.static_fields(), tuple[str, ...])
assert isinstance(params, js.Struct)


@js.register_class(name="Renamed")
class Named:
    x: int = 0


assert_type(Named().replace(x=1), Named)


class Base(js.Struct):
    w: float
    name: AbstractVar[str]

    def describe(self) -> str:
        return self.name


class ByProperty(Base):
    @property
    def name(self) -> str:
        return "p"


class ByField(Base):
    name: str = js.field(static=True, default="f")


class ByClassAttribute(Base):
    name = "c"


assert_type(ByProperty(w=1.0).name, str)
assert_type(ByProperty(1.0).replace(w=2.0), ByProperty)
assert_type(ByField(w=1.0, name="x").name, str)
assert_type(ByClassAttribute(w=1.0).describe(), str)
