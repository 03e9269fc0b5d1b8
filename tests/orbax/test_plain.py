"""Orbax checkpoints without a jaxstruct manifest, both ways: plain pytrees into structs, and
jaxstruct's orbax checkpoints read by plain orbax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.registry import SerializationError


class Linear(js.Struct):
    kernel: Any
    bias: Any
    act: str = js.field(static=True, default="relu")


class Params(js.Struct):
    embed: Any
    layers: list
    dropout: float = js.field(static=True, default=0.1)


class State(js.Struct):
    params: Params
    step: Any


def _nnx_like_state() -> dict[str, Any]:
    """A nested dict of arrays shaped like a flax ``nnx.state`` converted to pure dicts."""
    rng = np.random.default_rng(0)
    return {
        "params": {
            "embed": jnp.asarray(rng.standard_normal((16, 8)), jnp.bfloat16),
            "layers": [
                {
                    "kernel": jnp.asarray(rng.standard_normal((8, 8)), jnp.float32),
                    "bias": jnp.asarray(rng.standard_normal(8), jnp.float32),
                }
                for _ in range(2)
            ],
        },
        "step": jnp.array(12, jnp.int32),
    }


def _bits(x: Any) -> bytes:
    return np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8).tobytes()


def _abstract(x: Any, sharding: Any = None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


@pytest.fixture
def plain(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    state = _nnx_like_state()
    path = (tmp_path / "plain").absolute()
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()
    checkpointer.close()
    return path, state


def _target(state: dict[str, Any], sharding: Any = None) -> State:
    p = state["params"]
    return State(
        params=Params(
            embed=_abstract(p["embed"], sharding),
            layers=[
                Linear(kernel=_abstract(layer["kernel"], sharding), bias=_abstract(layer["bias"]))
                for layer in p["layers"]
            ],
            dropout=0.2,
        ),
        step=_abstract(state["step"]),
    )


def test_a_plain_orbax_checkpoint_fills_a_sharded_struct_bit_exact(plain) -> None:
    """StandardCheckpointer's nested dicts restore into a struct by tree path, on the target's
    shardings, bit-exact; classes and static fields come from the target."""
    path, state = plain
    sharding = NamedSharding(jax.make_mesh((4, 2), ("a", "b")), P("a", "b"))
    restored = jio.load(path, target=_target(state, sharding))
    assert type(restored) is State and restored.params.dropout == 0.2
    assert restored.params.layers[1].act == "relu"
    assert restored.params.embed.sharding == sharding
    assert restored.params.layers[0].kernel.sharding == sharding
    assert _bits(restored.params.embed) == _bits(state["params"]["embed"])
    assert restored.params.embed.dtype == jnp.bfloat16
    for got, want in zip(restored.params.layers, state["params"]["layers"], strict=True):
        assert _bits(got.kernel) == _bits(want["kernel"])
        assert _bits(got.bias) == _bits(want["bias"])
    assert int(restored.step) == 12


def test_format_keyword_and_numpy_leaves(plain) -> None:
    """``format="orbax"`` names the format; NumPy target leaves are restored as NumPy."""
    path, state = plain
    target = {"params": {"embed": np.zeros((16, 8), jnp.bfloat16)}}
    got = jio.load(
        path,
        format="orbax",
        target=target,
        rename=lambda n: n if n.startswith("params.embed") else None,
    )
    assert isinstance(got["params"]["embed"], np.ndarray)
    assert _bits(got["params"]["embed"]) == _bits(state["params"]["embed"])


def test_rename_and_unmatched_names(plain) -> None:
    """Names that differ are mapped with rename=; without it, one error names them all."""
    path, state = plain
    target = {
        "model": _target(state).params,
        "step": _abstract(state["step"]),
    }
    with pytest.raises(SerializationError) as info:
        jio.load(path, target=target)
    assert "target leaves with no tensor: 'model.embed'" in str(info.value)
    assert "tensors matching no target leaf: 'params.embed'" in str(info.value)
    got = jio.load(path, target=target, rename=lambda n: n.replace("params.", "model.", 1))
    assert _bits(got["model"].layers[1].bias) == _bits(state["params"]["layers"][1]["bias"])


def test_select_restores_only_the_picked_arrays(plain) -> None:
    path, state = plain
    got = jio.load(path, target=_target(state), select=lambda s: s.params.layers[0].kernel)
    assert _bits(got) == _bits(state["params"]["layers"][0]["kernel"])


def test_a_plain_checkpoint_is_never_overwritten(plain) -> None:
    """``overwrite=True`` replaces jaxstruct checkpoints only, never a plain orbax one."""
    path, _ = plain
    with pytest.raises(SerializationError, match="not a jaxstruct orbax checkpoint"):
        jio.export({"w": np.ones(2)}, path, format="orbax", overwrite=True)


def test_plain_orbax_reads_a_jaxstruct_checkpoints_arrays_by_tree_path(tmp_path: Path) -> None:
    """The other direction: plain ``StandardCheckpointer().restore`` of the ``arrays`` item of
    a jaxstruct orbax checkpoint gives the arrays as a nested dict by tree path (struct
    fields, dict keys and list indices as keys); the directory is a composite orbax
    checkpoint, and its ``arrays`` item is itself a plain one that ``load`` fills a target
    from."""

    class Dense(js.Struct):
        kernel: jax.Array
        bias: jax.Array

    state = {
        "params": {"layers": [Dense(kernel=jnp.arange(4.0), bias=jnp.ones(2, jnp.int32))]},
        "step": jnp.asarray(7),
        "mask": jnp.array([True, False]),
    }
    path = jio.export(state, (tmp_path / "ours").absolute(), format="orbax")
    checkpointer = ocp.StandardCheckpointer()
    try:
        arrays = checkpointer.restore(path / "arrays")
    finally:
        checkpointer.close()
    assert set(arrays) == {"params", "step", "mask"}
    layer = arrays["params"]["layers"]["0"]
    assert set(layer) == {"kernel", "bias"}
    assert _bits(layer["kernel"]) == _bits(state["params"]["layers"][0].kernel)
    assert _bits(layer["bias"]) == _bits(state["params"]["layers"][0].bias)
    assert int(arrays["step"]) == 7
    np.testing.assert_array_equal(np.asarray(arrays["mask"]), [1, 0])  # booleans as uint8
    # The arrays item alone, as a plain orbax checkpoint, into a target by tree path.
    sds = jax.ShapeDtypeStruct
    into = {"params": {"layers": [{"kernel": sds((4,), jnp.float32)}]}, "step": sds((), "int32")}
    skip = {"mask", "params.layers.0.bias"}
    got = jio.load(path / "arrays", target=into, rename=lambda n: None if n in skip else n)
    assert _bits(got["params"]["layers"][0]["kernel"]) == _bits(layer["kernel"])
    assert int(got["step"]) == 7


def test_orbax_metadata_size_is_limited_before_it_is_read(plain) -> None:
    path, state = plain
    with pytest.raises(SerializationError, match=r"_METADATA is .* more than max_manifest_bytes"):
        jio.load(path, target=_target(state), max_manifest_bytes=100)
    with pytest.raises(SerializationError, match="more than max_array_bytes=64"):
        jio.load(path, target=_target(state), max_array_bytes=64)
