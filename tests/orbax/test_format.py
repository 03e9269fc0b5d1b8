"""The orbax format of jaxstruct-orbax: registration, sharding, async, safety, migrations, URLs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxstruct.orbax import OrbaxFormat
from jaxstruct.orbax import _format as orbax_format
from jaxstruct.registry import SerializationError

from ._reseal import reseal

TIMEOUT = 120


class Model(js.Struct):
    w: Any
    tag: str = js.field(static=True, default="m")


def _sharded(shape: tuple[int, int] = (16, 8)) -> jax.Array:
    mesh = jax.make_mesh((8,), ("x",))
    data = jnp.arange(shape[0] * shape[1], dtype=jnp.float32).reshape(shape)
    return jax.device_put(data, NamedSharding(mesh, P("x")))


def test_registered_through_the_entry_point_group() -> None:
    """The format comes from the jaxstruct-orbax distribution's entry point, like any plugin."""
    registry = jio.PluginRegistry()
    fmt = registry.formats["orbax"]
    assert isinstance(fmt, OrbaxFormat)
    assert registry.source_of("format", "orbax") == "jaxstruct-orbax"
    assert (fmt.multiprocess, fmt.remote_paths, fmt.publishes_atomically) == (True, True, True)


def test_registering_does_not_import_orbax() -> None:
    """Loading the plugin (to list formats) leaves orbax-checkpoint unimported."""
    import subprocess

    code = (
        "import sys, jaxstruct.io as jio; jio.PluginRegistry().formats; "
        "print('orbax.checkpoint' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, check=True
    )
    assert out.stdout.strip() == "False"


def test_sharded_struct_round_trips_into_another_sharding(tmp_path: Path) -> None:
    """A sharded array in a struct restores into a different target sharding, class intact."""
    model = Model(w=_sharded(), tag="t")
    path = jio.export(model, tmp_path / "ck", format="orbax")
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    sharding = NamedSharding(mesh, P("b", "a"))
    target = Model(w=jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=sharding), tag="t")
    back = jio.load(path, target=target)
    assert type(back) is Model and back.tag == "t"
    assert back.w.sharding == sharding
    np.testing.assert_array_equal(np.asarray(back.w), np.asarray(model.w))


def test_async_export_uses_orbax_async_and_is_donation_safe(tmp_path: Path) -> None:
    """blocking=False returns before the commit; donating the input afterwards is safe."""
    w = _sharded()
    expected = np.asarray(w).copy()
    handle = jio.export({"w": w}, tmp_path / "ck", format="orbax", blocking=False)
    # The buffer is donated (or, while orbax still reads it, copied by JAX instead):
    # either way the checkpoint must hold the values at call time.
    jax.jit(lambda x: x * 0, donate_argnums=0)(w).block_until_ready()
    handle.wait(TIMEOUT)
    np.testing.assert_array_equal(np.asarray(jio.load(handle.path)["w"]), expected)


def test_manifest_alone_decides_classes(tmp_path: Path) -> None:
    """A class reference to a module not yet imported is refused, never imported."""
    path = jio.export(Model(w=np.ones(2)), tmp_path / "ck", format="orbax")
    manifest_file = path / "jaxstruct" / "metadata"
    document = json.loads(manifest_file.read_text())
    text = json.dumps(document).replace(f"{Model.__module__}:Model", "json.tool:NotAClass")
    manifest_file.write_text(text)
    reseal(path)  # as if the class reference had been saved so
    sys.modules.pop("json.tool", None)
    with pytest.raises(SerializationError, match=r"json\.tool"):
        jio.load(path)
    assert "json.tool" not in sys.modules


def test_struct_migrations_apply(tmp_path: Path) -> None:
    """A checkpoint of an older struct version loads through __struct_migrate__."""

    class Old(js.Struct):
        __struct_version__: ClassVar[int] = 0
        w: Any

    path = jio.export(Old(w=np.arange(3)), tmp_path / "ck", format="orbax")

    class New(js.Struct):
        __struct_version__: ClassVar[int] = 1
        weights: Any

        @classmethod
        def __struct_migrate__(cls, version: int, values: dict[str, Any]) -> dict[str, Any]:
            return {"weights": values.pop("w")}

    back = jio.load(path, load_cls=New)
    np.testing.assert_array_equal(back.weights, np.arange(3))


def test_manifest_limit_is_enforced(tmp_path: Path) -> None:
    """max_manifest_bytes is checked before the manifest is read."""
    path = jio.export({"a": list(range(100))}, tmp_path / "ck", format="orbax")
    with pytest.raises(SerializationError, match="max_manifest_bytes=10"):
        jio.load(path, max_manifest_bytes=10)


def test_tampered_array_shape_is_refused(tmp_path: Path) -> None:
    """An arrays table that disagrees with what orbax stored is a SerializationError."""
    path = jio.export({"a": np.zeros(4)}, tmp_path / "ck", format="orbax")
    manifest_file = path / "jaxstruct" / "metadata"
    text = manifest_file.read_text().replace('"shape": [4]', '"shape": [5]')
    manifest_file.write_text(text)
    reseal(path)  # a disagreement saved so, not a changed byte
    with pytest.raises(SerializationError, match="stored with shape"):
        jio.load(path)


def test_remote_paths_pass_through_to_orbax(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gs:// URL reaches orbax untouched, and nothing named 'gs:' appears locally."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    seen: list[str] = []
    real = orbax_format.to_path

    def fake_bucket(path: Any) -> Any:
        text = str(path)
        seen.append(text)
        if text.startswith("gs://bucket/"):
            return real(bucket / text.removeprefix("gs://bucket/"))
        return real(path)

    monkeypatch.setattr(orbax_format, "to_path", fake_bucket)
    monkeypatch.chdir(tmp_path)
    assert jio.export({"w": np.arange(3)}, "gs://bucket/ck", format="orbax") == "gs://bucket/ck"
    np.testing.assert_array_equal(jio.load("gs://bucket/ck")["w"], np.arange(3))
    assert "gs://bucket/ck" in seen and (bucket / "ck").is_dir()
    assert not (tmp_path / "gs:").exists()


def test_manager_with_orbax(tmp_path: Path) -> None:
    """CheckpointManager saves asynchronously through orbax and restores into a target."""
    manager = jio.CheckpointManager(tmp_path / "run", format="orbax", keep=1)
    manager.save(1, {"w": _sharded()})
    manager.save(2, {"w": _sharded() + 1})
    manager.wait()
    assert manager.all_steps() == [2]
    sharding = NamedSharding(jax.make_mesh((8,), ("x",)), P(None, "x"))
    back = manager.restore(
        target={"w": jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=sharding)}
    )
    assert back["w"].sharding == sharding
    assert np.asarray(back["w"])[0, 0] == 1.0


def test_overwrite_replaces_atomically(tmp_path: Path) -> None:
    """overwrite=True swaps in the new checkpoint, blocking or not."""
    path = jio.export({"v": 1}, tmp_path / "ck", format="orbax")
    jio.export({"v": 2}, path, format="orbax", overwrite=True)
    assert jio.load(path) == {"v": 2}
    jio.export({"v": 3}, path, format="orbax", overwrite=True, blocking=False).wait(TIMEOUT)
    assert jio.load(path) == {"v": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
