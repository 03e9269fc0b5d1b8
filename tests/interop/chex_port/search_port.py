"""A small tree-search library written for chex, as DeepMind's search libraries are.

Modelled on mctx's layout: frozen ``@chex.dataclass`` outputs of the user's
model (``RootFnOutput``, ``RecurrentFnOutput``), a generic search tree
``Tree[T]`` over the model's embeddings, updated with ``replace`` inside a
``jax.lax.fori_loop``, and the mapping habits chex dataclasses allow
(subscripts by field name, keys and items, double-star unpacking and
to_tuple). ``search_port.py`` is this file after the rewrite
docs/coming-from.md documents;
tests/interop/test_chex_port.py checks that nothing else changed.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import chex
import jax
import jax.numpy as jnp
import jaxstruct.core as js

T = TypeVar("T")


@js.dataclass(frozen=True)
class RootFnOutput(Generic[T]):
    prior_logits: chex.Array  # [B, A]
    value: chex.Array  # [B]
    embedding: T


@js.dataclass(frozen=True)
class RecurrentFnOutput:
    reward: chex.Array  # [B]
    discount: chex.Array  # [B]
    prior_logits: chex.Array  # [B, A]
    value: chex.Array  # [B]


@js.dataclass(frozen=True)
class Tree(Generic[T]):
    """Statistics of the root's children, one row per batch element."""

    visits: chex.Array  # [B, A]
    value_sums: chex.Array  # [B, A]
    rewards: chex.Array  # [B, A]
    prior_logits: chex.Array  # [B, A]
    root_value: chex.Array  # [B]
    embeddings: T

    @property
    def num_actions(self) -> int:
        return self.visits.shape[-1]

    def qvalues(self) -> chex.Array:
        means = self.value_sums / jnp.maximum(self.visits, 1).astype(jnp.float32)
        return jnp.where(self.visits > 0, means, self.root_value[:, None])


@js.dataclass(frozen=True)
class SearchSummary:
    visit_counts: chex.Array
    visit_probs: chex.Array
    qvalues: chex.Array
    value: chex.Array


@js.dataclass(frozen=True)
class PolicyOutput(Generic[T]):
    action: chex.Array
    action_weights: chex.Array
    search_tree: Tree[T]


def instantiate_tree(root: RootFnOutput[T]) -> Tree[T]:
    batch, num_actions = root.prior_logits.shape
    zeros = jnp.zeros((batch, num_actions), jnp.float32)
    return Tree(
        visits=jnp.zeros((batch, num_actions), jnp.int32),
        value_sums=zeros,
        rewards=zeros,
        prior_logits=root.prior_logits,
        root_value=root.value,
        embeddings=root.embedding,
    )


def select_actions(tree: Tree[Any], pb_c: float) -> chex.Array:
    visits = tree.visits.astype(jnp.float32)
    total = jnp.sum(visits, axis=-1, keepdims=True)
    prior = jax.nn.softmax(tree.prior_logits)
    bonus = pb_c * prior * jnp.sqrt(total + 1.0) / (1.0 + visits)
    return jnp.argmax(tree.qvalues() + bonus, axis=-1)


def backward(tree: Tree[T], action: chex.Array, step: RecurrentFnOutput) -> Tree[T]:
    reward, discount, _, value = tuple(step.to_dict().values())
    hit = jax.nn.one_hot(action, tree.num_actions)
    returns = reward + discount * value
    return tree.replace(
        visits=tree.visits + hit.astype(jnp.int32),
        value_sums=tree.value_sums + hit * returns[:, None],
        rewards=jnp.where(hit > 0, reward[:, None], tree.rewards),
    )


def summarize(tree: Tree[Any]) -> SearchSummary:
    counts = tree.visits.astype(jnp.float32)
    return SearchSummary(
        visit_counts=counts,
        visit_probs=counts / jnp.sum(counts, axis=-1, keepdims=True),
        qvalues=tree.qvalues(),
        value=tree.root_value,
    )


def search(
    params: Any,
    rng_key: chex.PRNGKey,
    root: RootFnOutput[T],
    recurrent_fn: Any,
    *,
    num_simulations: int,
    pb_c: float = 1.25,
) -> PolicyOutput[T]:
    tree = instantiate_tree(root)

    def body(i: int, tree: Tree[T]) -> Tree[T]:
        action = select_actions(tree, pb_c)
        key = jax.random.fold_in(rng_key, i)
        step, _ = recurrent_fn(params, key, action, tree.embeddings)
        return backward(tree, action, step)

    tree = jax.lax.fori_loop(0, num_simulations, body, tree)
    summary = summarize(tree)
    weights = summary.visit_probs
    return PolicyOutput(
        action=jnp.argmax(weights, axis=-1), action_weights=weights, search_tree=tree
    )


def summary_table(summary: SearchSummary) -> dict[str, Any]:
    """What a logging helper writes: every field of the summary, by name."""
    return {name: float(jnp.mean(value)) for name, value in summary.to_dict().items()}


def field_names(output: Any) -> list[str]:
    return list(output.to_dict().keys())


def with_value(output: RecurrentFnOutput, value: chex.Array) -> RecurrentFnOutput:
    return RecurrentFnOutput(**{**output.to_dict(), "value": value})
