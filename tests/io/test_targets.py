"""Formats by name, URL paths, PRNG keys, restore targets and partial restore (issue 10)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.registry import SerializationError

SUFFIX = {"directory": "", "zip": ".zip", "tar": ".tar", "orbax": ""}
FILE_FORMATS = tuple(SUFFIX)


class Params(js.Struct):
    w: Any
    b: Any


class TrainState(js.Struct):
    params: Params
    opt: Any
    step: int
    key: Any = None


def _mesh(shape: tuple[int, ...] = (8,), names: tuple[str, ...] = ("x",)) -> Any:
    return jax.make_mesh(shape, names, devices=jax.devices()[: int(np.prod(shape))])


def _state() -> TrainState:
    mesh = _mesh()
    w = jax.device_put(
        jnp.arange(64.0, dtype=jnp.float32).reshape(16, 4), NamedSharding(mesh, P("x"))
    )
    return TrainState(
        params=Params(w=w, b=jnp.ones(4, jnp.float32)),
        opt={"mu": np.zeros((16, 4), np.float32), "count": jnp.int32(3)},
        step=7,
        key=jax.random.key(1),
    )


@pytest.fixture(params=FILE_FORMATS)
def fmt(request: pytest.FixtureRequest) -> str:
    """Each file format: the two built-ins and the example tar plugin."""
    return request.param


def test_format_by_name_overrides_the_suffix(tmp_path: Path) -> None:
    """format="zip" writes a zip archive even without the .zip suffix."""
    path = jio.export({"a": np.arange(3)}, tmp_path / "ck", format="zip")
    assert path.is_file() and path.read_bytes()[:2] == b"PK"
    np.testing.assert_array_equal(jio.load(path)["a"], np.arange(3))


def test_unknown_format_name_is_refused(tmp_path: Path) -> None:
    """An unregistered format name is a SerializationError listing the registered ones."""
    with pytest.raises(SerializationError, match="'nope' is not a registered format"):
        jio.export({}, tmp_path / "ck", format="nope")
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("url", ["memory://bucket/ck", "gs://bucket/ck"])
def test_url_paths_are_refused_by_local_formats(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL given to a built-in format is refused and no local folder is created."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SerializationError, match=r'writes local paths only.*format="orbax"'):
        jio.export({"a": 1}, url, format="directory")
    assert list(tmp_path.iterdir()) == []


def test_prng_keys_round_trip(roundtrip: Any) -> None:
    """Typed PRNG keys (scalar and batched, two implementations) come back equal in every form."""
    value = {
        "k": jax.random.key(3),
        "batch": jax.random.split(jax.random.key(4), 5),
        "rbg": jax.random.key(5, impl="rbg"),
    }
    back = roundtrip(value)
    for name, key in value.items():
        got = back[name]
        assert jax.random.key_impl(got) == jax.random.key_impl(key)
        np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(key))
    # The restored key draws the same numbers.
    assert jax.random.uniform(back["k"]) == jax.random.uniform(value["k"])


def test_sharded_array_round_trips_without_caching_a_host_copy(fmt: str, tmp_path: Path) -> None:
    """A sharded array is written whole and its user's array keeps no cached host copy."""
    state = _state()
    path = jio.export(state, tmp_path / f"ck{SUFFIX[fmt]}", format=fmt)
    assert getattr(state.params.w, "_npy_value", None) is None
    back = jio.load(path)
    np.testing.assert_array_equal(np.asarray(back.params.w), np.asarray(state.params.w))


def test_target_shardings_are_used(fmt: str, tmp_path: Path) -> None:
    """Target leaves give each restored array its sharding (jax.Array, ShapeDtypeStruct)."""
    state = _state()
    path = jio.export(state, tmp_path / f"ck{SUFFIX[fmt]}", format=fmt)
    mesh = _mesh((4, 2), ("a", "b"))
    cols = NamedSharding(mesh, P(None, "a"))
    rows = NamedSharding(mesh, P("b"))
    target = jax.tree.map(lambda x: x, jax.eval_shape(lambda: state))
    target = target.replace(
        params=Params(
            w=jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=cols),
            b=jax.device_put(jnp.zeros(4, jnp.float32), rows),
        ),
    )
    back = jio.load(path, target=target)
    assert back.params.w.sharding == cols
    assert back.params.b.sharding == rows
    np.testing.assert_array_equal(np.asarray(back.params.w), np.arange(64.0).reshape(16, 4))
    assert back.step == 7
    np.testing.assert_array_equal(
        jax.random.key_data(back.key), jax.random.key_data(jax.random.key(1))
    )


def test_target_key_sharding_is_used(tmp_path: Path) -> None:
    """A PRNG key target with a sharding gives a key array with that sharding."""
    keys = jax.random.split(jax.random.key(0), 8)
    path = jio.export({"keys": keys}, tmp_path / "ck")
    sharding = NamedSharding(_mesh(), P("x"))
    back = jio.load(
        path, target={"keys": jax.ShapeDtypeStruct((8,), keys.dtype, sharding=sharding)}
    )
    assert back["keys"].sharding == sharding
    np.testing.assert_array_equal(jax.random.key_data(back["keys"]), jax.random.key_data(keys))


def test_target_without_sharding_and_none_load_as_stored(tmp_path: Path) -> None:
    """ShapeDtypeStruct without sharding and None leaves place arrays as without a target."""
    path = jio.export({"a": jnp.arange(4), "n": np.arange(3)}, tmp_path / "ck")
    back = jio.load(path, target={"a": jax.ShapeDtypeStruct((4,), jnp.int32), "n": None})
    assert isinstance(back["a"], jax.Array) and isinstance(back["n"], np.ndarray)
    assert back["a"].sharding == SingleDeviceSharding(jax.devices()[0])


def test_target_shape_mismatch_names_the_path(fmt: str, tmp_path: Path) -> None:
    """A target of the wrong shape is a SerializationError naming the tree path."""
    path = jio.export(_state(), tmp_path / f"ck{SUFFIX[fmt]}", format=fmt)
    target = jax.eval_shape(_state)
    target = target.replace(
        params=target.params.replace(w=jax.ShapeDtypeStruct((4, 4), jnp.float32))
    )
    with pytest.raises(SerializationError, match=r"root\.params\.w has shape \(4, 4\)"):
        jio.load(path, target=target)


def test_target_dtype_mismatch_names_the_path(tmp_path: Path) -> None:
    """A target of the wrong dtype is a SerializationError naming the tree path."""
    path = jio.export({"a": [np.zeros(2, np.float32)]}, tmp_path / "ck")
    with pytest.raises(SerializationError, match=r"root\['a'\]\[0\] has dtype int32"):
        jio.load(path, target={"a": [jax.ShapeDtypeStruct((2,), jnp.int32)]})


def test_target_structure_mismatch_names_the_path(tmp_path: Path) -> None:
    """A target missing a stored dict key is a SerializationError naming the path."""
    path = jio.export({"a": {"x": np.zeros(2), "y": np.zeros(2)}}, tmp_path / "ck")
    with pytest.raises(SerializationError, match=r"at root\['a'\] has key 'y'"):
        jio.load(path, target={"a": {"x": None}})


def test_target_non_array_leaf_is_refused(tmp_path: Path) -> None:
    """A target leaf that is not an array, struct or None where an array is stored is refused."""
    path = jio.export({"a": np.zeros(2)}, tmp_path / "ck")
    with pytest.raises(SerializationError, match=r"root\['a'\] is a builtins.int"):
        jio.load(path, target={"a": 3})


class _Spy:
    """Records the keys a format is asked to read."""

    def __init__(self) -> None:
        self.wanted: list[set[str]] = []


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> _Spy:
    """Wrap every opened checkpoint's read_arrays to record the requested keys."""
    record = _Spy()
    from jaxstruct.io import _load

    real = _load.open_any

    def wrapped(path: Any, limits: Any, format: Any) -> Any:
        fmt, opened, top = real(path, limits, format)
        inner = opened.read_arrays

        def read_arrays(table: Any, wanted: Any) -> Any:
            record.wanted.append(set(wanted))
            return inner(table, wanted)

        opened.read_arrays = read_arrays  # type: ignore[method-assign]
        return fmt, opened, top

    monkeypatch.setattr(_load, "open_any", wrapped)
    return record


def test_partial_restore_reads_only_the_selected_arrays(
    fmt: str, tmp_path: Path, spy: _Spy
) -> None:
    """select= returns the picked part and reads only the arrays inside it."""
    state = _state()
    path = jio.export(state, tmp_path / f"ck{SUFFIX[fmt]}", format=fmt)
    params = jio.load(path, select=lambda s: s.params)
    assert isinstance(params, Params)
    np.testing.assert_array_equal(np.asarray(params.w), np.asarray(state.params.w))
    assert len(spy.wanted) == 1 and len(spy.wanted[0]) == 2


def test_partial_restore_with_a_selection(tmp_path: Path, spy: _Spy) -> None:
    """select= may return a jaxstruct Selection; only its selected arrays are read."""
    state = _state()
    path = jio.export(state, tmp_path / "ck")
    sel = jio.load(path, select=lambda s: js.select(s).at_instances_of(Params).at(lambda p: p.b))
    (b,) = sel.get_sequence()
    np.testing.assert_array_equal(np.asarray(b), np.ones(4))
    assert len(spy.wanted[0]) == 1


def test_partial_restore_with_target_shardings(tmp_path: Path) -> None:
    """select= and target= combine: the selected arrays land in the target's shardings."""
    state = _state()
    path = jio.export(state, tmp_path / "ck")
    sharding = NamedSharding(_mesh(), P())
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        jax.eval_shape(lambda: state.params),
    )
    full_target = jax.eval_shape(lambda: state).replace(params=target)
    params = jio.load(path, target=full_target, select=lambda s: s.params)
    assert params.w.sharding == sharding


def test_partial_restore_accessor_error_is_ours(tmp_path: Path) -> None:
    """A select= function that fails on the structure is a SerializationError."""
    path = jio.export({"a": np.zeros(2)}, tmp_path / "ck")
    with pytest.raises(SerializationError, match=r"select=.*failed on the stored structure"):
        jio.load(path, select=lambda s: s["missing"])


def test_target_walk_survives_a_shared_node(tmp_path: Path) -> None:
    """A tampered manifest whose nodes share children fails cleanly when a target is given."""
    import json
    import zipfile

    path = jio.export({"a": [[np.zeros(1)]] * 1}, tmp_path / "ck.zip")
    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    doc = json.loads(members["manifest.json"])
    nodes = doc["manifest"]["nodes"]
    # Make every list node point twice at its child: 2**depth paths without the guard.
    for node in nodes:
        if node[0] == "list":
            node[1] = node[1] * 2
    members["manifest.json"] = json.dumps(doc).encode()
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(SerializationError):
        jio.load(bad, target={"a": [[None, None], [None, None]]})


class Converted(js.Struct):
    a: Any = js.field(converter=jnp.asarray)


def test_partial_restore_with_value_converters_reads_everything(tmp_path: Path, spy: _Spy) -> None:
    """When a class's converter needs real arrays, select= still works, reading every array."""
    path = jio.export({"c": Converted(a=np.ones(3, np.float32)), "y": np.zeros(2)}, tmp_path / "ck")
    y = jio.load(path, select=lambda s: s["y"])
    np.testing.assert_array_equal(y, np.zeros(2))
    assert spy.wanted == [{"a0", "a1"}]


def test_partial_restore_skips_weakly_typed_scalars(fmt: str, tmp_path: Path, spy: _Spy) -> None:
    """select= of one array reads only it when the value also holds a weakly typed scalar,
    and a selected weak scalar comes back weak."""
    value = {"lr": jnp.asarray(0.1), "w": jnp.arange(3.0), "b": np.ones(2)}
    path = jio.export(value, tmp_path / f"ck{SUFFIX[fmt]}", format=fmt)
    w = jio.load(path, select=lambda v: v["w"])
    np.testing.assert_array_equal(np.asarray(w), np.arange(3.0))
    assert len(spy.wanted) == 1 and len(spy.wanted[0]) == 1
    lr = jio.load(path, select=lambda v: v["lr"])
    assert lr.weak_type and float(lr) == pytest.approx(0.1)
    assert len(spy.wanted) == 2 and len(spy.wanted[1]) == 1
