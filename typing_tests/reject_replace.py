"""``replace`` calls that type checkers must reject.

Pyright types ``replace`` from the ``__replace__`` it synthesises for
dataclass-like classes, which it does from ``pythonVersion = "3.13"`` on; mypy
types it on every version through ``jaxstruct.core.mypy_plugin``.
"""

import jax.numpy as jnp
import jaxstruct.core as js


class Layer(js.Struct):
    w: jnp.ndarray
    act: str = js.field(static=True, default="relu")
    size: int = js.field(static=True, init=False, derived=lambda self: 1)


layer = Layer(w=jnp.ones(2))
layer.replace(typo=1)  # expected-error[mypy,pyright-3.13]
layer.replace(act=3)  # expected-error[mypy,pyright-3.13]
layer.replace(size=2)  # expected-error[mypy,pyright-3.13]
layer.replace(jnp.ones(2))  # expected-error
bad: str = layer.replace()  # expected-error
