"""jaxstruct end to end: define structs, transform them with JAX, update, inspect.

Run with:  uv run python examples/demo.py
"""

from __future__ import annotations

import abc
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxstruct.abc as jsa
import jaxstruct.core as js


class Layer(js.Struct, metaclass=jsa.StructABCMeta):
    """An abstract base: every concrete layer must define __call__."""

    @abc.abstractmethod
    def __call__(self, x: jax.Array) -> jax.Array: ...


class Linear(Layer):
    """A dense layer: arrays are node fields, the activation is static."""

    w: jax.Array
    b: jax.Array
    activation: str = js.field(static=True, default="tanh")

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x @ self.w + self.b
        return jnp.tanh(y) if self.activation == "tanh" else y


class MLP(js.Struct):
    """Two layers and an opaque cache that JAX never sees."""

    hidden: Linear
    out: Linear
    n_in: int = js.field(static=True, init=False, derived=lambda self: self.hidden.w.shape[0])
    notes: dict = js.field(pytree=False, default_factory=dict)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.hidden(x))


class TrainState(js.Struct):
    """Parameters plus static bookkeeping; the learning rate is validated."""

    params: MLP
    # A counter that changes every step is a node field: as a static field it
    # would force a new compilation of train_step at every step.
    step: jax.Array = js.field(default_factory=lambda: jnp.array(0))
    lr: float = js.field(static=True, default=0.1, converter=float, validator=lambda v: v > 0)


def make_state(key: jax.Array) -> TrainState:
    k1, k2 = jax.random.split(key)
    hidden = Linear(w=jax.random.normal(k1, (3, 8)) * 0.5, b=jnp.zeros(8))
    out = Linear(w=jax.random.normal(k2, (8, 1)) * 0.5, b=jnp.zeros(1), activation="none")
    return TrainState(params=MLP(hidden=hidden, out=out), lr="0.05")


def loss_fn(params: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((params(x)[:, 0] - y) ** 2)


@jax.jit
def train_step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(state.params, x, y)
    params = jax.tree_util.tree_map(lambda p, g: p - state.lr * g, state.params, grads)
    return state.replace(params=params, step=state.step + 1), loss


def main() -> None:
    key = jax.random.PRNGKey(0)
    state = make_state(key)
    print("initial state:", state)
    print(
        "node/static/opaque/derived fields of MLP:",
        MLP.node_fields(),
        MLP.static_fields(),
        MLP.opaque_fields(),
        MLP.derived_fields(),
    )
    print("leaves:", state.tree_size())

    x = jax.random.normal(key, (64, 3))
    y = jnp.sin(x.sum(axis=1))
    state, first = train_step(state, x, y)
    loss = first
    for _ in range(199):
        state, loss = train_step(state, x, y)
    print(f"loss {float(first):.4f} -> {float(loss):.4f} after {int(state.step)} steps")
    assert float(loss) < float(first)

    # vmap over a batch of layers built by stacking the leaves.
    batch = jax.tree_util.tree_map(lambda a: jnp.stack([a, 2 * a]), state.params.hidden)
    print("vmapped layer outputs:", jax.vmap(lambda layer: layer(x[:1]).sum())(batch))

    # Frozen: updates go through replace().
    try:
        state.step = jnp.array(0)  # type: ignore[misc]
    except js.FrozenStructError as err:
        print("frozen:", err)
    try:
        state.replace(lr=-1.0)
    except js.ValidationError as err:
        print("rejected:", err)

    # Abstract bases cannot be instantiated.
    try:
        Layer()  # pyright: ignore[reportAbstractUsage] - the point of the example
    except TypeError as err:
        print("abstract:", err)

    # Functional edits deep in the tree: zero the output bias with a selector.
    zeroed = state.select().at(lambda s: s.params.out.b).apply(jnp.zeros_like)
    assert float(jnp.abs(zeroed.params.out.b).sum()) == 0.0 and zeroed.step == state.step
    print("selector edit: out.b ->", zeroed.params.out.b)

    # Checkpoints: a directory or a .zip archive, written atomically. Loading
    # imports nothing and runs no code of classes this process did not define.
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("step_200", "step_200.zip"):
            path = state.export(Path(tmp) / name)
            restored = TrainState.load(path)
            assert restored == state and restored.params.n_in == 3
            print(f"exported and loaded {path.name}: equal = {restored == state}")


if __name__ == "__main__":
    main()
