"""What docs/coming-from.md, performance.md and scale.md say about peers, checked against them.

Issue 28, item 5: every claim about flax (NNX), equinox, orbax or JAX on those
pages runs here against the installed version (the peers come from the
``bench`` dependency group; see tests/conftest.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")

import jaxstruct.core as js  # noqa: E402

# -- equinox: when converters run ----------------------------------------------------


def test_equinox_runs_converters_after_a_user_init_and_after_post_init() -> None:
    class WithInit(eqx.Module):
        x: float = eqx.field(converter=float)

        def __init__(self, x: Any) -> None:
            self.x = x

    seen = []

    class WithPostInit(eqx.Module):
        x: float = eqx.field(converter=float)

        def __post_init__(self) -> None:
            seen.append(type(self.x))

    assert type(WithInit(1).x) is float
    assert type(WithPostInit(1).x) is float and seen == [int]  # after __post_init__


def test_equinox_tree_at_skips_converters_and_jaxstruct_replace_runs_them() -> None:
    class E(eqx.Module):
        x: float = eqx.field(converter=float)

    assert type(eqx.tree_at(lambda m: m.x, E(1), 5).x) is int

    class S(js.Struct):
        x: float = js.field(converter=float)

        def __init__(self, x: Any) -> None:
            self.x = x

    assert type(S(1).replace(x=5).x) is float


# -- flax NNX -------------------------------------------------------------------------


def test_nnx_raises_on_an_array_in_a_static_attribute() -> None:
    class Bad(nnx.Module):
        def __init__(self) -> None:
            self.table = nnx.static(jnp.ones(2))

    with pytest.raises(ValueError, match="static"):
        Bad()


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(3, 4, rngs=rngs)
        self.out = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(jax.nn.relu(self.hidden(x)))


class TrainState(js.Struct):
    """The docs' example: an NNX model split into a static graphdef and its State."""

    graphdef: Any = js.field(static=True)
    params: Any
    step: jax.Array = js.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    lr: float = js.field(static=True, default=0.1)

    def model(self) -> Any:
        return nnx.merge(self.graphdef, self.params)


@jax.jit
def train_step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, jax.Array]:
    def loss(params: Any) -> jax.Array:
        return jnp.mean((nnx.merge(state.graphdef, params)(x) - y) ** 2)

    value, grads = jax.value_and_grad(loss)(state.params)
    params = jax.tree.map(lambda p, g: p - state.lr * g, state.params, grads)
    return state.replace(params=params, step=state.step + 1), value


def test_an_nnx_model_lives_in_a_struct_as_graphdef_and_state() -> None:
    graphdef, params = nnx.split(MLP(nnx.Rngs(0)))
    state = TrainState(graphdef=graphdef, params=params)
    x, y = jnp.ones((8, 3)), jnp.zeros((8, 1))
    first = None
    for _ in range(3):
        state, value = train_step(state, x, y)
        first = value if first is None else first
    assert int(state.step) == 3 and float(value) < float(first)
    assert state.model()(x).shape == (8, 1)
    # The graphdef is hashable static data; the State's arrays are the leaves.
    assert len(jax.tree.leaves(state)) == 5  # 2 kernels, 2 biases, step
    # A checkpoint of the struct: the arrays go into a state dict, the graphdef is
    # rebuilt by the program (it is code, not data), as with nnx's own checkpoints.
    restored = jax.tree.map(np.asarray, state)
    assert restored.graphdef == state.graphdef


# -- orbax, JAX ----------------------------------------------------------------------


# orbax warns that it takes the shardings from the checkpoint when none are given.
@pytest.mark.filterwarnings("ignore:Sharding info not provided:UserWarning")
def test_orbax_v1_save_and_load_without_a_target(tmp_path) -> None:
    ocp = pytest.importorskip("orbax.checkpoint")
    state = {"params": {"w": jnp.ones((3, 2))}, "step": 10}
    ocp.v1.save(tmp_path / "10", state)
    restored = ocp.v1.load(tmp_path / "10")
    assert restored["step"] == 10 and restored["params"]["w"].shape == (3, 2)


def test_orbax_array_store_takes_local_paths_and_gs_but_not_s3() -> None:
    """docs/scale.md: orbax builds its TensorStore spec for gs:// and local paths only (its
    own function, which jaxstruct-orbax wraps once it sees an s3:// URL)."""
    import inspect

    utils = pytest.importorskip("orbax.checkpoint._src.serialization.tensorstore_utils")
    build = inspect.unwrap(utils.build_kvstore_tspec)
    assert build("gs://bucket/run", name="w")
    assert build("/tmp/run", name="w")
    with pytest.raises(ValueError, match="absolute"):
        build("s3://bucket/run", name="w")


def test_register_dataclass_calls_the_class_on_unflatten() -> None:
    """docs/performance.md: true of the JAX version the page names."""
    import dataclasses

    calls = []

    @dataclasses.dataclass
    class D:
        x: Any

        def __post_init__(self) -> None:
            calls.append(1)

    jax.tree_util.register_dataclass(D, data_fields=["x"], meta_fields=[])
    jax.tree.map(lambda v: v, D(1))
    assert len(calls) == 2, jax.__version__


def test_the_nnx_tab_of_the_guide_runs() -> None:
    """docs/coming-from.md's NNX tab (shown, not run by the docs runner) is current API."""
    optax = pytest.importorskip("optax")
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    @nnx.jit
    def train_step(model: Any, optimizer: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    x, y = jnp.ones((8, 3)), jnp.zeros((8, 1))
    assert float(train_step(model, optimizer, x, y)) > float(train_step(model, optimizer, x, y))


def test_orbax_still_has_the_standard_checkpointer() -> None:
    ocp = pytest.importorskip("orbax.checkpoint")
    assert callable(ocp.StandardCheckpointer)


def test_jaxstruct_converts_before_post_init() -> None:
    seen = []

    class S(js.Struct):
        x: float = js.field(converter=float)

        def __post_init__(self) -> None:
            seen.append(type(self.x))

    S(1)
    assert seen == [float]


def test_nnx_modules_are_pytrees_and_graphdefs_are_hashable() -> None:
    assert issubclass(nnx.Module, nnx.Pytree)
    graphdef, _ = nnx.split(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
    assert hash(graphdef) == hash(nnx.split(nnx.Linear(2, 2, rngs=nnx.Rngs(1)))[0])

    @nnx.dataclass
    class Config(nnx.Pytree):
        w: jax.Array = nnx.data()
        n: int = nnx.static()

    assert jax.tree.leaves(Config(w=jnp.ones(2), n=3))[0].shape == (2,)
    assert len(jax.tree.leaves(Config(w=jnp.ones(2), n=3))) == 1


def test_flax_struct_raises_a_value_error_for_a_foreign_state_dict() -> None:
    """coming-from.md: jaxstruct's SerializationError is a ValueError, as flax's error is."""
    from flax import serialization, struct

    @struct.dataclass
    class F:
        x: Any

    with pytest.raises(ValueError, match="Missing field"):
        serialization.from_state_dict(F(x=1), {})


def test_peers_accept_a_redeclared_default_and_keep_the_position() -> None:
    """coming-from.md: dataclasses, flax.struct and equinox accept a redeclared default."""
    import dataclasses

    from flax import struct

    class EBase(eqx.Module):
        a: int = 1
        b: int = 2

    class EChild(EBase):
        a: int = 5

    @struct.dataclass
    class FBase:
        a: int = 1
        b: int = 2

    @struct.dataclass
    class FChild(FBase):
        a: int = 5

    class JBase(js.Struct):
        a: int = 1
        b: int = 2

    class JChild(JBase):
        a: int = 5

    for cls in (EChild, FChild, JChild):
        assert [f.name for f in dataclasses.fields(cls)] == ["a", "b"], cls
        assert cls().a == 5, cls
