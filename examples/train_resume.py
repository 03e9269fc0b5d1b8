"""A training loop that survives being killed: save every 10 steps, resume where it stopped.

The state is a struct holding the model, its optax AdamW state, the step and a
PRNG key, sharded over 8 devices. The optimizer is code, not data: it is a
static field declared ``serialize=False``, so it is never stored, and the
restore target (built by the same code that builds a fresh state) supplies it,
along with every class in the optimizer's state. No ``allow_imports``, no
``.replace(tx=...)`` after a restore.

Three models, as teams arrive with them: a dict of arrays (``--model mlp``),
an ``equinox.nn.MLP`` (``--model equinox``), and a ``flax.struct`` train
state of flax's own ``TrainState`` (``--model flax``).

Run:  uv run python examples/train_resume.py /tmp/run1 --steps 200
Kill it at any moment and run the same command again: it resumes at the newest
complete step and trains on. ``--dump PATH`` exports the final state.
"""

from __future__ import annotations

import os

# Eight host devices; must be set before JAX starts.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

SAVE_EVERY = 10
IN, HIDDEN, OUT = 16, 64, 8


class TrainState(js.Struct):
    """Everything a training job resumes from; ``tx`` comes from the code, never the file."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    tx: Any = js.field(static=True, default=None, serialize=False)


class FlaxRun(js.Struct):
    """flax's own ``TrainState`` (a ``flax.struct`` dataclass) inside a struct, with the key."""

    train: train_state.TrainState
    rng: jax.Array


def _mlp_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (IN, HIDDEN)) / IN**0.5,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, OUT)) / HIDDEN**0.5,
    }


def _mlp_apply(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]


def _batch(rng: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The data of one step: a function of the key and the step only, so a resume sees it too."""
    kx, kn = jax.random.split(jax.random.fold_in(rng, step))
    x = jax.random.normal(kx, (32, IN))
    y = jnp.sin(x[:, :OUT]) + 0.01 * jax.random.normal(kn, (32, OUT))
    return x, y


def create(model: str) -> Any:
    """A fresh state for ``model``: the same code builds the restore target."""
    tx = optax.adamw(1e-2)
    key, rng = jax.random.split(jax.random.key(0))
    if model == "flax":
        params = _mlp_params(key)
        state = train_state.TrainState.create(apply_fn=_mlp_apply, params=params, tx=tx)
        return FlaxRun(train=state, rng=rng)
    if model == "equinox":
        params = eqx.nn.MLP(IN, OUT, HIDDEN, depth=1, activation=jnp.tanh, key=key)
        opt_state = tx.init(eqx.filter(params, eqx.is_inexact_array))
    else:
        params = _mlp_params(key)
        opt_state = tx.init(params)
    return TrainState(params, opt_state, jnp.array(0, jnp.int32), rng, tx=tx)


def _loss(apply: Callable[..., jax.Array], params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((apply(params, x) - y) ** 2)


@jax.jit
def _step_mlp(state: TrainState) -> TrainState:
    x, y = _batch(state.rng, state.step)
    grads = jax.grad(lambda p: _loss(_mlp_apply, p, x, y))(state.params)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1)


@eqx.filter_jit
def _step_equinox(state: TrainState) -> TrainState:
    x, y = _batch(state.rng, state.step)
    grads = eqx.filter_grad(lambda m: _loss(lambda m, x: jax.vmap(m)(x), m, x, y))(state.params)
    params = eqx.filter(state.params, eqx.is_inexact_array)
    updates, opt_state = state.tx.update(grads, state.opt_state, params)
    model = eqx.apply_updates(state.params, updates)
    return state.replace(params=model, opt_state=opt_state, step=state.step + 1)


@jax.jit
def _step_flax(run: FlaxRun) -> FlaxRun:
    t = run.train
    x, y = _batch(run.rng, jnp.asarray(t.step, jnp.int32))
    grads = jax.grad(lambda p: _loss(t.apply_fn, p, x, y))(t.params)
    return run.replace(train=t.apply_gradients(grads=grads))


STEPS = {"mlp": _step_mlp, "equinox": _step_equinox, "flax": _step_flax}


def _sharding(mesh: jax.sharding.Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Split the last dimension over the devices when it divides; replicate the rest."""
    if shape and shape[-1] % mesh.size == 0:
        return NamedSharding(mesh, P(*([None] * (len(shape) - 1)), "model"))
    return NamedSharding(mesh, P())


def shard(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """Place every array of ``tree`` (or give every abstract one its sharding)."""

    def place(leaf: Any) -> Any:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(
                leaf.shape, leaf.dtype, sharding=_sharding(mesh, leaf.shape)
            )
        if isinstance(leaf, jax.Array):
            return jax.device_put(leaf, _sharding(mesh, leaf.shape))
        return leaf  # the functions of an equinox model

    return jax.tree.map(place, tree)


def current_step(state: Any) -> int:
    return int(state.train.step if isinstance(state, FlaxRun) else state.step)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train, save every 10 steps, resume.")
    parser.add_argument("directory")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--model", choices=sorted(STEPS), default="mlp")
    parser.add_argument("--format", default="directory")
    parser.add_argument("--dump", help="export the final state here")
    args = parser.parse_args(argv)

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("model",))
    manager = jio.CheckpointManager(args.directory, format=args.format, keep=3)
    latest = manager.latest_step()
    if latest is None:
        state = shard(create(args.model), mesh)
        print("starting at step 0", flush=True)
    else:
        # The target: shapes, dtypes and shardings, plus everything that is code or
        # classes (the optimizer, optax's state types): the same code as a fresh start.
        # (equinox models hold functions, which jax.eval_shape refuses: eqx's own keeps them.)
        eval_shape = eqx.filter_eval_shape if args.model == "equinox" else jax.eval_shape
        target = shard(eval_shape(lambda: create(args.model)), mesh)
        state = manager.restore(latest, target=target)
        print(f"resumed at step {current_step(state)}", flush=True)

    step_fn = STEPS[args.model]
    while current_step(state) < args.steps:
        state = step_fn(state)
        step = current_step(state)
        if step % SAVE_EVERY == 0:
            print(f"saving step {step}", flush=True)
            manager.save(step, state)
    manager.wait()
    print(f"done at step {current_step(state)}", flush=True)
    if args.dump:
        jio.export(state, args.dump, overwrite=True)


if __name__ == "__main__":
    main()
