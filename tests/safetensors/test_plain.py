"""Safetensors files other tools wrote (no jaxstruct manifest), loaded into struct targets."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest
import safetensors.flax
import safetensors.numpy
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.registry import SerializationError


class Dense(js.Struct):
    kernel: Any
    bias: Any
    act: str = js.field(static=True, default="relu")


class Net(js.Struct):
    layers: list
    step: int = 0
    name: str = js.field(static=True, default="net")


def _abstract(x: Any, sharding: Any = None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _bits(x: Any) -> bytes:
    return np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8).tobytes()


@pytest.fixture
def flax_file(tmp_path: Path) -> tuple[Path, dict[str, jax.Array]]:
    """A file written by ``safetensors.flax.save_file``: bfloat16, float8 and float32 tensors."""
    tensors = {
        "layers.0.kernel": jnp.arange(64, dtype=jnp.bfloat16).reshape(8, 8) / 7,
        "layers.0.bias": jnp.linspace(-1, 1, 8).astype(jnp.float8_e4m3fn),
        "layers.1.kernel": jnp.arange(16, dtype=jnp.float32).reshape(8, 2) * 0.1,
        "layers.1.bias": jnp.ones(2, jnp.float32),
    }
    path = tmp_path / "flax.safetensors"
    safetensors.flax.save_file(tensors, str(path), metadata={"source": "test"})
    return path, tensors


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the positioned reads made from here on (``os.preadv``), appended as made."""
    read: list[int] = []
    real = os.preadv

    def counting(fd: int, buffers: list, offset: int) -> int:
        read.append(sum(len(b) for b in buffers))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", counting)
    return read


def _target(tensors: dict[str, Any], sharding: Any = None) -> Net:
    return Net(
        layers=[
            Dense(
                kernel=_abstract(tensors["layers.0.kernel"], sharding),
                bias=_abstract(tensors["layers.0.bias"]),
                act="gelu",
            ),
            Dense(
                kernel=_abstract(tensors["layers.1.kernel"]),
                bias=_abstract(tensors["layers.1.bias"]),
            ),
        ],
        step=5,
        name="restored",
    )


def test_a_flax_file_fills_a_sharded_struct_bit_exact(flax_file) -> None:
    """Tensors go to the leaves of the same tree path, on the target's shardings, bit-exact;
    classes, static fields and non-array leaves come from the target."""
    path, tensors = flax_file
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    sharding = NamedSharding(mesh, P("a", "b"))
    net = jio.load(path, target=_target(tensors, sharding))
    assert type(net) is Net and net.name == "restored" and net.step == 5
    assert net.layers[0].act == "gelu" and net.layers[1].act == "relu"
    assert net.layers[0].kernel.sharding == sharding
    for name, value in tensors.items():
        _, index, field = name.split(".")
        got = getattr(net.layers[int(index)], field)
        assert got.dtype == value.dtype and got.shape == value.shape
        assert _bits(got) == _bits(value), name


def test_a_numpy_file_fills_a_struct_of_numpy_leaves(tmp_path: Path) -> None:
    """A file written by ``safetensors.numpy.save_file`` restores into NumPy leaves, bit-exact."""
    rng = np.random.default_rng(0)
    tensors = {
        "layers.0.kernel": rng.standard_normal((3, 4)).astype(np.float64),
        "layers.0.bias": rng.integers(-9, 9, 4).astype(np.int16),
        "layers.1.kernel": np.array([[True, False]]),
        "layers.1.bias": rng.integers(0, 255, 2).astype(np.uint8),
    }
    path = tmp_path / "np.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    target = Net(
        layers=[
            Dense(kernel=np.zeros((3, 4)), bias=np.zeros(4, np.int16)),
            Dense(kernel=np.zeros((1, 2), bool), bias=np.zeros(2, np.uint8)),
        ]
    )
    net = jio.load(path, target=target)
    assert isinstance(net.layers[0].kernel, np.ndarray)
    for name, value in tensors.items():
        _, index, field = name.split(".")
        got = getattr(net.layers[int(index)], field)
        assert got.dtype == value.dtype and _bits(got) == _bits(value), name


def test_unmatched_tensors_and_leaves_are_all_named(flax_file) -> None:
    """One error names every tensor without a leaf and every leaf without a tensor."""
    path, tensors = flax_file
    target = _target(tensors)
    target = Net(
        layers=[target.layers[0], Dense(kernel=target.layers[1].kernel, bias=None)], step=0
    )
    renamed = {"layers.1.kernel": "layers.1.w", "layers.1.bias": "layers.1.b"}
    with pytest.raises(SerializationError) as info:
        jio.load(path, target=target, rename=renamed)
    message = str(info.value)
    assert "target leaves with no tensor: 'layers.1.kernel'" in message
    assert "'layers.1.bias (renamed layers.1.b)', 'layers.1.kernel (renamed layers.1.w)'" in message
    assert "rename=" in message


def test_rename_by_mapping_and_by_function(tmp_path: Path) -> None:
    """Names that differ are mapped by a dict or a function; ``None`` ignores a tensor."""
    path = tmp_path / "hf.safetensors"
    safetensors.numpy.save_file(
        {
            "model.dense.weight": np.ones((2, 2), np.float32),
            "model.dense.bias": np.zeros(2, np.float32),
            "lm_head.weight": np.ones(1, np.float32),
        },
        str(path),
    )
    target = {"dense": Dense(kernel=np.zeros((2, 2), np.float32), bias=np.zeros(2, np.float32))}
    by_dict = jio.load(
        path,
        target=target,
        rename=lambda n: (
            None if n.startswith("lm_head") else n.replace("model.", "").replace("weight", "kernel")
        ),
    )
    assert by_dict["dense"].kernel.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    with pytest.raises(SerializationError, match=r"tensors matching no target leaf: 'lm_head"):
        jio.load(
            path,
            target=target,
            rename={"model.dense.weight": "dense.kernel", "model.dense.bias": "dense.bias"},
        )


def test_two_tensors_renamed_to_one_leaf_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.safetensors"
    safetensors.numpy.save_file({"a": np.ones(1), "b": np.ones(1)}, str(path))
    with pytest.raises(SerializationError, match="both name the leaf 'x'"):
        jio.load(path, target={"x": np.ones(1)}, rename={"a": "x", "b": "x"})


def test_dtype_or_shape_mismatch_names_tensor_and_leaf(flax_file) -> None:
    path, tensors = flax_file
    target = _target(tensors)
    bad = Net(
        layers=[
            target.layers[0],
            Dense(kernel=np.zeros((8, 2), np.float16), bias=target.layers[1].bias),
        ]
    )
    with pytest.raises(
        SerializationError,
        match=r"'layers.1.kernel' is float32 \(8, 2\), but "
        r"the target leaf 'layers.1.kernel' is float16",
    ):
        jio.load(path, target=bad)


def test_without_a_target_a_dict_of_the_tensors_by_name(flax_file) -> None:
    """load(path) of a file another tool wrote gives ``{tensor name: NumPy array}`` in the
    file's order, bit-exact (a safetensors file is nothing but named tensors)."""
    path, tensors = flax_file
    got = jio.load(path)
    assert type(got) is dict and sorted(got) == sorted(tensors)
    for name, arr in tensors.items():
        assert isinstance(got[name], np.ndarray) and got[name].dtype == arr.dtype
        assert _bits(got[name]) == _bits(arr)


def test_without_a_target_mesh_is_refused(flax_file) -> None:
    """mesh= needs saved shardings, which a file another tool wrote lacks: an error saying
    to pass a target, never host arrays silently in place of the mesh."""
    path, _ = flax_file
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    with pytest.raises(SerializationError, match=r"records no shardings; pass target="):
        jio.load(path, mesh=mesh)


def test_without_a_target_rename_and_select_apply_to_the_dict(flax_file, bytes_read) -> None:
    """rename= renames or drops the dict's keys; select= picks from the dict, and only the
    picked tensor is read; two tensors renamed alike are refused."""
    path, tensors = flax_file
    renamed = jio.load(path, rename=lambda n: None if "bias" in n else n.replace(".", "/"))
    assert sorted(renamed) == ["layers/0/kernel", "layers/1/kernel"]
    bytes_read.clear()
    got = jio.load(path, select=lambda d: d["layers.1.kernel"])
    assert _bits(got) == _bits(tensors["layers.1.kernel"]) and sum(bytes_read) == 8 * 2 * 4
    with pytest.raises(SerializationError, match=r"both get the name 'w'; fix rename="):
        jio.load(path, rename=lambda n: "w")


def test_select_reads_only_the_picked_leaves(flax_file, bytes_read) -> None:
    """With ``select=``, only the picked leaves' tensors are read; unmatched others are fine."""
    path, tensors = flax_file
    target = _target(tensors)
    got = jio.load(path, target=target, select=lambda n: n.layers[1].kernel)
    assert _bits(got) == _bits(tensors["layers.1.kernel"])
    assert sum(bytes_read) == 8 * 2 * 4


def test_format_keyword_reads_a_file_without_the_suffix(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    safetensors.numpy.save_file({"w": np.arange(3, dtype=np.int32)}, str(path))
    got = jio.load(path, target={"w": np.zeros(3, np.int32)}, format="safetensors")
    assert got["w"].tolist() == [0, 1, 2]
