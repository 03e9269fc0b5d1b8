"""Sharded jax.Arrays in the built-in formats: written shard by shard, read slice by slice."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxstruct.io._builtin import DirectoryFormat, ZipFormat
    from jaxstruct.io._encode import encode_state
    from jaxstruct.io._schema import Limits
    from jaxstruct.io._encode import dump_manifest
    from jaxstruct.io._schema import check_arrays_table, parse_manifest

    assert len(jax.devices()) == 8
    root = Path(sys.argv[1])
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
    host = np.arange(16 * 6, dtype=np.float32).reshape(16, 6)
    specs = [P("x", "y"), P("x"), P(None, "y"), P()]
    n = 0
    for spec in specs:
        arr = jax.device_put(host, NamedSharding(mesh, spec))
        for fmt in (DirectoryFormat(), ZipFormat()):
            for compression in ("none", "deflate"):
                n += 1
                state = encode_state({"w": np.zeros_like(host)})
                manifest = dump_manifest(state, fmt.name)
                path = root / f"ck{n}{fmt.suffixes[0] if fmt.suffixes else ''}"
                fmt.write(path, manifest, {"a0": arr}, compression=compression, step=lambda s: None)
                # written shard by shard: no host copy was cached on the user's array
                assert getattr(arr, "_npy_value", None) is None, spec
                opened = fmt.open(path, Limits())
                try:
                    top = parse_manifest(opened.manifest, "x")
                    table = check_arrays_table(top["arrays"], "x", Limits())
                    whole = opened.read_arrays(table)["a0"]
                    np.testing.assert_array_equal(whole, host)
                    for want in specs:
                        sharding = NamedSharding(mesh, want)
                        got = opened.read_arrays(table, {"a0": sharding})["a0"]
                        assert got.sharding.is_equivalent_to(sharding, 2), (spec, want)
                        np.testing.assert_array_equal(np.asarray(got), host)
                finally:
                    opened.close()
    print("ok", n)
    """
)


def test_sharded_arrays_round_trip_on_eight_devices(tmp_path: Path) -> None:
    """Every sharding of a 2-D array is written without gathering and read back placed as asked."""
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split() == ["ok", "16"]


@pytest.mark.parametrize("rows", [16, 1024], ids=["small", "4MiB"])
@pytest.mark.parametrize("spec", ["rows", "columns", "both", "replicated"])
@pytest.mark.parametrize("suffix", ["", ".zip"], ids=["directory", "zip"])
def test_sharded_load_checks_the_crc(rows: int, spec: str, suffix: str, tmp_path: Path) -> None:
    """A load placed with a sharding checks every member's CRC, as a plain load does: one
    flipped byte of a stored array raises, whichever way the array is split."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    pspec = {"rows": P("x"), "columns": P(None, "y"), "both": P("x", "y"), "replicated": P()}
    host = np.arange(rows * 256, dtype=np.float32).reshape(rows, 256)
    path = jio.export({"w": host}, tmp_path / f"ck{suffix}", compression="none")
    sharding = NamedSharding(mesh, pspec[spec])
    target = {"w": jax.ShapeDtypeStruct(host.shape, host.dtype, sharding=sharding)}
    back = jio.load(path, target=target)["w"]
    assert back.sharding == sharding
    np.testing.assert_array_equal(np.asarray(back), host)
    archive = path / "arrays.npz" if suffix == "" else path
    data = bytearray(archive.read_bytes())
    pos = data.find(host[rows - 3].tobytes())
    assert pos > 0
    data[pos + 17] ^= 0x01
    archive.write_bytes(bytes(data))
    with pytest.raises(SerializationError, match="CRC mismatch"):
        jio.load(path)
    with pytest.raises(SerializationError, match="CRC mismatch"):
        jio.load(path, target=target)


@pytest.mark.parametrize("compression", ["none", "deflate"])
@pytest.mark.parametrize("how", ["one device", "rows over 4 devices", "columns over 2 devices"])
def test_a_load_into_cpu_devices_hands_jax_its_own_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, compression: str
) -> None:
    """A load into a target on CPU devices reads each device's part into a 64-byte aligned
    buffer, which JAX adopts: the loaded shards are those buffers, not copies of them (one
    copy of a model more at the peak before)."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    host = np.arange(512 * 256, dtype=np.float32).reshape(512, 256)  # 512 KiB: mmap'd by malloc
    path = jio.export({"x": host}, tmp_path / "ck", compression=compression)
    devices = jax.devices()
    sharding = {
        "one device": jax.sharding.SingleDeviceSharding(devices[1]),
        "rows over 4 devices": NamedSharding(Mesh(np.array(devices[:4]), ("d",)), P("d")),
        "columns over 2 devices": NamedSharding(Mesh(np.array(devices[:2]), ("d",)), P(None, "d")),
    }[how]
    handed: list[int] = []
    put = jax.device_put

    def spy(value: object, *args: object, **kwargs: object) -> object:
        if isinstance(value, np.ndarray):
            handed.append(value.ctypes.data)
        return put(value, *args, **kwargs)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(jax, "device_put", spy)
    target = {"x": jax.ShapeDtypeStruct(host.shape, host.dtype, sharding=sharding)}
    out = jio.load(path, target=target)["x"]
    monkeypatch.undo()
    np.testing.assert_array_equal(np.asarray(out), host)
    assert out.sharding == sharding
    shards = sorted(s.data.unsafe_buffer_pointer() for s in out.addressable_shards)
    assert sorted(handed) == shards
