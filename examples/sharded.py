"""A sharded train state saved with the checkpoint manager and restored into a new mesh.

Run with:  uv run python examples/sharded.py   (it forces 8 CPU devices itself)
"""

from __future__ import annotations

import os

# Eight host devices; must be set before JAX starts.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


class Params(js.Struct):
    """Weights of a two-layer MLP."""

    w1: jax.Array
    w2: jax.Array


class TrainState(js.Struct):
    """Parameters, optimizer momentum, step counter and PRNG key."""

    params: Params
    momentum: Params
    step: int
    rng: jax.Array
    lr: float = js.field(static=True, default=0.1)


def init(mesh: jax.sharding.Mesh) -> TrainState:
    """A state whose weights are sharded over the mesh's "model" axis."""
    k1, k2, rng = jax.random.split(jax.random.key(0), 3)
    shard = NamedSharding(mesh, P(None, "model"))
    params = Params(
        w1=jax.device_put(jax.random.normal(k1, (32, 64)), shard),
        w2=jax.device_put(jax.random.normal(k2, (64, 64)), shard),
    )
    zeros = jax.tree.map(jnp.zeros_like, params)
    return TrainState(params=params, momentum=zeros, step=0, rng=rng)


@jax.jit
def train_step(state: TrainState, x: jax.Array) -> TrainState:
    """One step of SGD with momentum on a toy loss."""

    def loss(params: Params) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ params.w1) @ params.w2) ** 2

    grads = jax.grad(loss)(state.params)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g, state.momentum, grads)
    params = jax.tree.map(lambda p, m: p - state.lr * m, state.params, momentum)
    return state.replace(params=params, momentum=momentum, step=state.step + 1)


def main(directory: Path, fmt: str) -> None:
    """Train on a (2, 4) mesh, save with the manager, restore onto an (8,) mesh."""
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    state = init(mesh)
    x = jnp.ones((8, 32))
    manager = jio.CheckpointManager(directory, keep=2, format=fmt)
    for _ in range(3):
        state = train_step(state, x)
        manager.save(state.step, state, metrics={"step": int(state.step)})  # in the background
    manager.wait()
    print("saved steps:", manager.all_steps())

    # A new mesh with another layout: every weight sharded by rows over 8 devices.
    new_mesh = jax.make_mesh((8,), ("rows",))
    by_rows = NamedSharding(new_mesh, P("rows"))
    target = jax.tree.map(
        lambda leaf: (
            jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=by_rows)
            if leaf.ndim == 2
            else None
        ),
        jax.eval_shape(lambda: state),
    )
    restored = manager.restore(target=target)
    assert restored.params.w1.sharding == by_rows
    assert int(restored.step) == int(state.step) == 3
    np.testing.assert_array_equal(np.asarray(restored.params.w2), np.asarray(state.params.w2))
    # Only the parameters (the optimizer state is never read):
    params = manager.restore(select=lambda s: s.params)
    print("restored", type(restored).__name__, "at step", int(restored.step))
    print("w1 sharding:", restored.params.w1.sharding.spec, "| params only:", type(params).__name__)


if __name__ == "__main__":
    main(
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "run",
        sys.argv[2] if len(sys.argv) > 2 else "orbax",
    )
