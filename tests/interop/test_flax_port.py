"""A flax.struct library ported to jaxstruct by the documented rewrite runs as before (issue 28).

``flax_port/gym_flax.py`` is a small environment library written for
flax.struct (inheritance chains that change defaults, ``dataclasses.field``,
``struct.field(pytree_node=False)``, a logging wrapper); ``flax_port/gym_port.py``
is the same file after the rewrite docs/coming-from.md gives, and nothing else.
Both run the same rollouts, user code written for the flax version (a subclass
decorated with ``@flax.struct.dataclass``) runs on the port unchanged, and a
batch of states saved with flax.serialization round-trips.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
import jaxstruct.core as js  # noqa: E402
from flax import serialization, struct  # noqa: E402

HERE = Path(__file__).resolve().parent / "flax_port"


def documented_rewrite(source: str) -> str:
    """The rewrite docs/coming-from.md gives for a flax.struct library (and nothing more)."""
    # A dataclass with no struct parent becomes a js.Struct subclass; subclasses keep
    # their @struct.dataclass, dataclasses.field and struct.field(pytree_node=False).
    ported = re.sub(r"@struct\.dataclass\nclass (\w+):", r"class \1(js.Struct):", source)
    return ported.replace(
        "import jax.numpy as jnp\n", "import jax.numpy as jnp\nimport jaxstruct.core as js\n", 1
    )


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"flax_port_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # string annotations resolve in it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def libs() -> dict[str, ModuleType]:
    return {"flax": _load("gym_flax"), "port": _load("gym_port")}


def test_the_port_is_the_documented_rewrite_and_nothing_else() -> None:
    original = (HERE / "gym_flax.py").read_text(encoding="utf-8")
    assert (HERE / "gym_port.py").read_text(encoding="utf-8") == documented_rewrite(original)


def test_the_port_defines_structs(libs: dict[str, ModuleType]) -> None:
    port = libs["port"]
    for name in ("EnvState", "PendulumState", "ArmParams", "LogEnvState"):
        assert issubclass(getattr(port, name), js.Struct)
    # Redeclared inherited fields keep the parent's position and take the new default.
    assert next(iter(port.PendulumParams.fields())) == "max_steps_in_episode"
    assert port.PendulumParams().max_steps_in_episode == 200
    assert list(port.ArmState.fields()) == ["time", "angles", "velocities"]
    # struct.field(pytree_node=False) is static, dataclasses.field(default_factory=...) honoured.
    assert port.ArmParams.static_fields() == ("n_links",)
    a, b = port.ArmParams(), port.ArmParams()
    assert a.available_torque is not b.available_torque
    np.testing.assert_array_equal(a.available_torque, [-1.0, 0.0, 1.0])


def _rollout(lib: ModuleType, env_name: str, params: Any, steps: int = 60, batch: int = 4):
    env = lib.LogWrapper(getattr(lib, env_name)())
    keys = jax.random.split(jax.random.key(0), batch)
    _obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    n_actions = 3

    def one(carry, key):
        state = carry
        k_act, k_step = jax.random.split(key)
        if env_name == "Arm":
            action = jax.random.randint(k_act, (batch,), 0, n_actions)
        else:
            action = jax.random.uniform(k_act, (batch,), minval=-2.0, maxval=2.0)
        step_keys = jax.random.split(k_step, batch)
        obs, state, reward, done = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            step_keys, state, action, params
        )
        return state, (obs, reward, done)

    run = jax.jit(lambda s: jax.lax.scan(one, s, jax.random.split(jax.random.key(1), steps)))
    return run(state)


@pytest.mark.parametrize("env_name", ["Pendulum", "Arm"])
def test_rollouts_are_bit_identical(libs: dict[str, ModuleType], env_name: str) -> None:
    results = {}
    for which, lib in libs.items():
        params = getattr(lib, env_name)().default_params()
        results[which] = _rollout(lib, env_name, params)
    flax_leaves = jax.tree.leaves(results["flax"])
    port_leaves = jax.tree.leaves(results["port"])
    assert len(flax_leaves) == len(port_leaves) > 0
    for x, y in zip(flax_leaves, port_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _user_code(lib: ModuleType) -> type:
    """Code a library's user wrote against the flax version: it runs on the port unchanged."""

    @struct.dataclass
    class CustomParams(lib.PendulumParams):
        reward_scale: float = 1.0
        max_steps_in_episode: int = 30
        label: str = struct.field(pytree_node=False, default="custom")

    return CustomParams


def test_user_subclasses_decorated_with_flax_run_on_the_port(libs) -> None:
    custom = {which: _user_code(lib) for which, lib in libs.items()}
    port_cls = custom["port"]
    assert issubclass(port_cls, libs["port"].PendulumParams) and issubclass(port_cls, js.Struct)
    params = port_cls(reward_scale=2.0)
    assert (params.max_steps_in_episode, params.max_speed, params.label) == (30, 8.0, "custom")
    assert port_cls.static_fields() == ("label",)
    assert params.replace(reward_scale=3.0).reward_scale == 3.0
    flax_params = custom["flax"](reward_scale=2.0)
    assert jax.tree.leaves(params) == jax.tree.leaves(flax_params)
    runs = [_rollout(libs[w], "Pendulum", custom[w](reward_scale=2.0)) for w in ("flax", "port")]
    for x, y in zip(*map(jax.tree.leaves, runs), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_batch_of_states_saved_with_flax_serialization(libs: dict[str, ModuleType]) -> None:
    """A runner state (a dict holding a batch of LogEnvStates) survives to_bytes/from_bytes."""
    saved = {}
    for which, lib in libs.items():
        params = lib.Pendulum().default_params()
        state, _ = _rollout(lib, "Pendulum", params, steps=7)
        runner = {"env_state": state, "step": jnp.asarray(7), "params": params}
        saved[which] = (runner, serialization.to_bytes(runner))
    (runner, raw), (flax_runner, flax_raw) = saved["port"], saved["flax"]
    # The same state dicts: the port's bytes are the flax version's bytes.
    assert raw == flax_raw
    assert jax.tree.structure(serialization.to_state_dict(runner)) == jax.tree.structure(
        serialization.to_state_dict(flax_runner)
    )
    target = jax.tree.map(jnp.zeros_like, runner)
    restored = serialization.from_bytes(target, raw)
    assert type(restored["env_state"]) is libs["port"].LogEnvState
    assert type(restored["env_state"].env_state) is libs["port"].PendulumState
    for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(runner), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # Restored into the flax version's target from the port's bytes, and back.
    flax_target = jax.tree.map(jnp.zeros_like, flax_runner)
    crossed = serialization.from_bytes(flax_target, raw)
    assert type(crossed["env_state"]) is libs["flax"].LogEnvState
