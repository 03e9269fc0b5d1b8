"""A small environment library written for flax.struct, as JAX RL libraries are.

Modelled on gymnax's layout (a base ``EnvState``/``EnvParams`` that every
environment subclasses, redeclaring inherited fields to change their defaults;
``dataclasses.field`` for array defaults; ``struct.field(pytree_node=False)``
for settings; a logging wrapper whose state is saved with flax.serialization).
``gym_port.py`` is this file after the rewrite docs/coming-from.md documents;
tests/interop/test_flax_port.py checks that nothing else changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class EnvState:
    time: int


@struct.dataclass
class EnvParams:
    max_steps_in_episode: int = 1


class Environment:
    """Resets automatically at the end of an episode, as gymnax's environments do."""

    def default_params(self) -> Any:
        raise NotImplementedError

    def step_env(self, key: jax.Array, state: Any, action: jax.Array, params: Any) -> Any:
        raise NotImplementedError

    def reset_env(self, key: jax.Array, params: Any) -> Any:
        raise NotImplementedError

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any) -> Any:
        key_step, key_reset = jax.random.split(key)
        obs_st, state_st, reward, done = self.step_env(key_step, state, action, params)
        obs_re, state_re = self.reset_env(key_reset, params)
        state = jax.tree.map(lambda x, y: jax.lax.select(done, x, y), state_re, state_st)
        obs = jax.lax.select(done, obs_re, obs_st)
        return obs, state, reward, done


# -- a pendulum ---------------------------------------------------------------------


@struct.dataclass
class PendulumState(EnvState):
    theta: jax.Array
    theta_dot: jax.Array
    last_u: jax.Array
    time: int


@struct.dataclass
class PendulumParams(EnvParams):
    max_speed: float = 8.0
    max_torque: float = 2.0
    dt: float = 0.05
    g: float = 10.0
    m: float = 1.0
    length: float = 1.0
    max_steps_in_episode: int = 200


class Pendulum(Environment):
    def default_params(self) -> PendulumParams:
        return PendulumParams()

    def step_env(self, key, state, action, params):
        u = jnp.clip(action, -params.max_torque, params.max_torque)
        cost = state.theta**2 + 0.1 * state.theta_dot**2 + 0.001 * (u**2)
        speed = (
            state.theta_dot
            + (
                3 * params.g / (2 * params.length) * jnp.sin(state.theta)
                + 3.0 / (params.m * params.length**2) * u
            )
            * params.dt
        )
        speed = jnp.clip(speed, -params.max_speed, params.max_speed)
        theta = state.theta + speed * params.dt
        state = state.replace(theta=theta, theta_dot=speed, last_u=u, time=state.time + 1)
        done = state.time >= params.max_steps_in_episode
        obs = jnp.stack([jnp.cos(theta), jnp.sin(theta), speed])
        return obs, state, -cost, done

    def reset_env(self, key, params):
        high = jnp.array([jnp.pi, 1.0])
        theta, theta_dot = jax.random.uniform(key, (2,), minval=-high, maxval=high)
        state = PendulumState(theta=theta, theta_dot=theta_dot, last_u=jnp.array(0.0), time=0)
        return jnp.stack([jnp.cos(theta), jnp.sin(theta), theta_dot]), state


# -- an arm with array parameters and static settings ------------------------------


@struct.dataclass
class ArmState(EnvState):
    angles: jax.Array
    velocities: jax.Array
    time: int


@struct.dataclass
class ArmParams(EnvParams):
    link_lengths: jax.Array = dataclasses.field(default_factory=lambda: jnp.array([1.0, 0.5]))
    available_torque: jax.Array = dataclasses.field(
        default_factory=lambda: jnp.array([-1.0, 0.0, 1.0])
    )
    n_links: int = struct.field(pytree_node=False, default=2)
    dt: float = 0.1
    max_steps_in_episode: int = 50


class Arm(Environment):
    def default_params(self) -> ArmParams:
        return ArmParams()

    def step_env(self, key, state, action, params):
        torque = params.available_torque[action]
        noise = 0.01 * jax.random.normal(key, (params.n_links,))
        velocities = state.velocities + (torque + noise) * params.dt / params.link_lengths
        angles = state.angles + velocities * params.dt
        state = state.replace(angles=angles, velocities=velocities, time=state.time + 1)
        reach = jnp.sum(params.link_lengths * jnp.cos(angles))
        done = state.time >= params.max_steps_in_episode
        return jnp.concatenate([angles, velocities]), state, reach, done

    def reset_env(self, key, params):
        angles = jax.random.uniform(key, (params.n_links,), minval=-0.1, maxval=0.1)
        state = ArmState(angles=angles, velocities=jnp.zeros(params.n_links), time=0)
        return jnp.concatenate([angles, state.velocities]), state


# -- a logging wrapper ---------------------------------------------------------------


@struct.dataclass
class LogEnvState:
    env_state: Any
    episode_returns: float
    episode_lengths: int
    returned_episode_returns: float
    returned_episode_lengths: int
    timestep: int


class LogWrapper:
    def __init__(self, env: Environment) -> None:
        self._env = env

    def reset(self, key, params):
        obs, env_state = self._env.reset_env(key, params)
        return obs, LogEnvState(env_state, 0.0, 0, 0.0, 0, 0)

    def step(self, key, state, action, params):
        obs, env_state, reward, done = self._env.step(key, state.env_state, action, params)
        new_return = state.episode_returns + reward
        new_length = state.episode_lengths + 1
        state = LogEnvState(
            env_state=env_state,
            episode_returns=jnp.where(done, 0.0, new_return),
            episode_lengths=jnp.where(done, 0, new_length),
            returned_episode_returns=jnp.where(done, new_return, state.returned_episode_returns),
            returned_episode_lengths=jnp.where(done, new_length, state.returned_episode_lengths),
            timestep=state.timestep + 1,
        )
        return obs, state, reward, done
