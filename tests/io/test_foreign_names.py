"""Classes registered with JAX only: their arrays are named by JAX's key paths.

An equinox module's weight sits at ``layers.0.weight`` in ``jax.tree_util``'s
key paths; a checkpoint names it so too (tensor names in ``.safetensors``,
``jaxstruct inspect``, restore targets by path), not by child position.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError


@dataclasses.dataclass
class Dense:
    weight: np.ndarray
    bias: np.ndarray
    act: str = dataclasses.field(default="relu", metadata={"static": True})


jax.tree_util.register_dataclass(Dense, data_fields=["weight", "bias"], meta_fields=["act"])


class Unkeyed:
    """Registered without keys: JAX gives its children positions only."""

    def __init__(self, left: np.ndarray, right: np.ndarray) -> None:
        self.left, self.right = left, right


jax.tree_util.register_pytree_node(
    Unkeyed, lambda u: ((u.left, u.right), None), lambda _, ch: Unkeyed(*ch)
)


# Older JAX releases (the lowest-versions runs) cannot rebuild such a node from its
# stored parts: there a load says so, and the names are still written.
REBUILDS = hasattr(jax.tree_util.PyTreeDef, "from_node_data_and_children")


def _load(path: Path) -> Any:
    if REBUILDS:
        return jio.load(path, allow_imports=[__name__])
    with pytest.raises(SerializationError, match=r"JAX .* cannot rebuild Dense.*newer JAX"):
        jio.load(path, allow_imports=[__name__])
    return None


def _model() -> dict[str, object]:
    layers = [Dense(np.full((2, 3), i, np.float32), np.full(3, i, np.float32)) for i in range(2)]
    return {"layers": layers, "pair": Unkeyed(np.zeros(1), np.ones(1))}


def _manifest(path: Path) -> dict[str, object]:
    top = json.loads((path / "manifest.json").read_text())
    top.pop("checksum", None)  # a hand-edited manifest carries no checksum
    return top


def test_arrays_are_named_by_jax_key_paths(tmp_path: Path) -> None:
    path = jio.export(_model(), tmp_path / "ck", format="directory")
    names = sorted(jio.array_paths(_manifest(path)).values())
    assert names == [
        "layers.0.bias",
        "layers.0.weight",
        "layers.1.bias",
        "layers.1.weight",
        "pair.0",  # no keys registered: positions, as JAX's own key paths give
        "pair.1",
    ]
    back = _load(path)
    if back is None:
        return
    assert type(back["layers"][1]) is Dense and back["layers"][1].act == "relu"
    np.testing.assert_array_equal(back["layers"][1].weight, np.full((2, 3), 1, np.float32))
    np.testing.assert_array_equal(back["pair"].right, np.ones(1))


def test_the_inspect_listing_names_the_children(tmp_path: Path) -> None:
    path = jio.export(_model(), tmp_path / "ck", format="directory")
    listing = jio.inspect(path).tree
    assert ".weight" in listing and ".bias" in listing and "<child 0>" in listing


def _drop_names(path: Path) -> None:
    top = _manifest(path)
    nodes = top["manifest"]["nodes"]  # type: ignore[index]
    for node in nodes:
        if node[0] == "pytree" and len(node) == 6:
            del node[5]
    (path / "manifest.json").write_bytes(jio.seal_manifest(top))


def test_a_checkpoint_without_child_names_still_loads(tmp_path: Path) -> None:
    """Written before children were named: positions, and the same values back."""
    path = jio.export(_model(), tmp_path / "ck", format="directory")
    _drop_names(path)
    assert "layers.0.0" in jio.array_paths(_manifest(path)).values()
    back = _load(path)
    if back is not None:
        np.testing.assert_array_equal(back["layers"][0].bias, np.zeros(3, np.float32))


@pytest.mark.parametrize("names", [["weight"], ["weight", 3], "weight,bias"])
def test_malformed_child_names_are_refused(tmp_path: Path, names: object) -> None:
    path = jio.export({"d": _model()["layers"][0]}, tmp_path / "ck", format="directory")  # type: ignore[index]
    top = _manifest(path)
    node = next(n for n in top["manifest"]["nodes"] if n[0] == "pytree")  # type: ignore[index]
    node[5] = names
    (path / "manifest.json").write_bytes(jio.seal_manifest(top))
    with pytest.raises(SerializationError, match="malformed pytree node"):
        jio.load(path, allow_imports=[__name__])


def test_an_equinox_model_and_a_file_named_like_it_meet() -> None:
    """Export an equinox model to .safetensors: its tensors carry the names a file of the
    same model written by another tool has, and such a file loads into the model."""
    eqx = pytest.importorskip("equinox")
    from safetensors.numpy import load_file, save_file

    model = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        ours = jio.export(model, Path(scratch) / "ours.safetensors")
        tensors = load_file(str(ours))
        assert {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"} <= set(
            tensors
        )
        theirs = Path(scratch) / "theirs.safetensors"
        save_file({k: v * 2 for k, v in tensors.items() if k.startswith("layers.")}, str(theirs))
        back = jio.load(theirs, target=model)
        np.testing.assert_array_equal(
            np.asarray(back.layers[1].bias), 2 * np.asarray(model.layers[1].bias)
        )


def test_a_target_mismatch_inside_an_equinox_module_names_the_field(tmp_path: Path) -> None:
    """A target of the wrong shape inside another library's node is named by its field
    (``.weight``), as export names it, not by its position."""
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    path = jio.export({"mlp": model}, tmp_path / "ck")
    target = {"mlp": eqx.nn.Linear(2, 4, key=jax.random.key(0))}
    with pytest.raises(
        SerializationError, match=r"target at root\['mlp'\]\.(weight|bias) has shape"
    ):
        jio.load(path, target=target)


def test_a_dict_key_a_target_cannot_name_is_told_plainly(tmp_path: Path) -> None:
    """A stored tuple key under a target dict gets a message naming the key, not an
    internal marker object."""
    path = jio.export({(1, 2): np.zeros(2)}, tmp_path / "ck")
    with pytest.raises(SerializationError, match=r"has a key that is not a str.*None for the"):
        jio.load(path, target={(1, 2): None})
