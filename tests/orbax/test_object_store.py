"""Checkpoints in object stores through the orbax format, against local servers started on
127.0.0.1 (a free port, throwaway credentials, stopped afterwards): fake-gcs-server for gs://,
moto's S3-compatible server for s3://."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._stores import STORES, Served, serve

WORKER = Path(__file__).with_name("_store_worker.py")
TIMEOUT = 300


@pytest.fixture(scope="module", params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Served]:
    with serve(request.param) as served:
        yield served


def test_export_and_load_through_an_object_store(store: Served) -> None:
    """Export (blocking and not, overwrite), load (as stored, resharded, mesh=, select=), the
    manager (listing, metrics, keep, best, pruning, killed saves), refusals."""
    env = {**os.environ, **store.env, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    _run_ok([str(WORKER), f"{store.root}/run"], env)
    stored = store.objects("run/")
    assert "run/ck/jaxstruct/metadata" in stored, stored
    assert "run/ck/commit_success.txt" in stored, stored  # committed by a marker, no rename
    assert not any(".orbax-checkpoint-tmp" in name for name in stored), stored
    assert any(name.startswith("run/ck/arrays/ocdbt.process_0/d/") for name in stored), stored
    assert "run/async/jaxstruct/metadata" in stored, stored
    assert not any(name.startswith("run/builtin-") for name in stored), stored


_BLOCKS = """
import sys
import jax, numpy as np
import jaxstruct.io as jio
data = np.random.default_rng(0).standard_normal((2048, 1024)).astype(np.float32)  # 8 MiB
path = jio.export({"w": jax.device_put(data)}, sys.argv[1], format="orbax")
one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
target = {"w": jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=one)}
back = jio.load(sys.argv[1], target=target)["w"]
assert np.array_equal(np.asarray(back), data)
print("OK")
"""


def test_object_stores_hold_data_files_of_one_read_block(store: Served) -> None:
    """8 MiB saved to a bucket is stored in objects of one read block (2 MiB here, not one
    32 MiB file), so a restore reads whole objects a few at a time; it comes back exact."""
    env = {**os.environ, **store.env, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    _run_ok(["-c", _BLOCKS, f"{store.root}/blocks"], env)
    data = [n for n in store.objects("blocks/") if "/arrays/ocdbt.process_0/d/" in n]
    assert len(data) >= 4, data


def _run_ok(argv: list[str], env: dict[str, str]) -> None:
    """Run a Python program; it must print OK and exit 0 (its stderr shown otherwise)."""
    out = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr[-3000:]


@pytest.mark.parametrize("url", ["memory://ck", "az://container/ck"])
def test_urls_orbax_cannot_store_to_are_refused_clearly(url: str) -> None:
    """The format writes local paths, gs:// and s3:// only."""
    import jaxstruct.io as jio
    import numpy as np
    from jaxstruct.registry import SerializationError

    with pytest.raises(SerializationError, match=r"\(gs://, s3://\) only, not at"):
        jio.export({"w": np.ones(2)}, url, format="orbax")
    with pytest.raises(SerializationError, match=r"no registered format .* recognises"):
        jio.load(url)


_EXPLICIT = """
import os, sys, jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np, jaxstruct.io as jio
from jax.sharding import NamedSharding, PartitionSpec as P
import jaxstruct.orbax

NAMES = set(sys.argv[3].split(","))
assert not NAMES & set(os.environ), NAMES & set(os.environ)
CONFIGURE
mesh = jax.make_mesh((8,), ("x",))
w = jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("x")))
url = sys.argv[1] + "/ck"
jio.export({"w": w}, url, format="orbax")
jio.export({"w": w + 1}, url, format="orbax", overwrite=True)
np.testing.assert_array_equal(np.asarray(jio.load(url, mesh=mesh)["w"]), np.asarray(w + 1))
manager = jio.CheckpointManager(sys.argv[1] + "/run", format="orbax", keep=1)
manager.save(1, {"w": w})
manager.save(2, {"w": w})
manager.wait()
assert manager.all_steps() == [2], manager.all_steps()
assert not NAMES & set(os.environ)
print("OK")
"""

# Per store: the call in code, the variables that would otherwise name the server or the
# credentials (checked absent in the program), the prefixes of the variables its clients read
# (none is passed on), and what keeps the program off the
# machine's own credentials and metadata servers (no variable of the store's clients).
_CONFIGURE = {
    "s3": (
        "jaxstruct.orbax.configure_s3(endpoint=sys.argv[2], region='us-east-1', "
        "access_key_id='throwaway', secret_access_key='throwaway')",
        ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"),
        ("AWS_",),
        {
            "AWS_CONFIG_FILE": os.devnull,  # no profile of the machine's user is read
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        },
    ),
    "gcs": (
        "jaxstruct.orbax.configure_gcs(endpoint=sys.argv[2], token='anon', user_project='billed')",
        (
            "STORAGE_EMULATOR_HOST",
            "TENSORSTORE_GCS_HTTP_URL",
            "FSSPEC_GS_TOKEN",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
            "GOOGLE_AUTH_TOKEN_FOR_TESTING",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ),
        ("STORAGE_EMULATOR_", "TENSORSTORE_GCS_", "FSSPEC_G", "GCSFS_", "GOOGLE_", "CLOUDSDK_"),
        # Tensorstore's credential search: no gcloud file of the machine's user, and its
        # GCE metadata probe goes to a closed local port instead of metadata.google.internal.
        {"CLOUDSDK_CONFIG": "EMPTY_DIR", "GCE_METADATA_ROOT": "127.0.0.1:9"},
    ),
}


def test_explicit_settings_without_the_store_variables(store: Served, tmp_path: Path) -> None:
    """configure_s3(endpoint=, region=, keys) / configure_gcs(endpoint=, token="anon") alone
    reach the server: no variable names it (without the endpoint, every client would ask
    Amazon's or Google's own)."""
    configure, names, prefixes, isolation = _CONFIGURE[store.kind]
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.pop("XLA_FLAGS", None)
    env.update(JAX_PLATFORMS="cpu")
    env.update({k: str(tmp_path) if v == "EMPTY_DIR" else v for k, v in isolation.items()})
    program = _EXPLICIT.replace("CONFIGURE", configure)
    _run_ok(["-c", program, f"{store.root}/explicit", store.url, ",".join(names)], env)
    stored = store.objects("explicit/")
    assert "explicit/ck/commit_success.txt" in stored, stored
    assert any(n.startswith("explicit/ck/arrays/ocdbt.process_0/d/") for n in stored), stored
    assert "explicit/run/2/commit_success.txt" in stored, stored
    assert not any(name.startswith("explicit/run/1/") for name in stored), stored


def test_configure_s3_refuses_half_a_key() -> None:
    from jaxstruct.orbax import configure_s3
    from jaxstruct.registry import SerializationError

    with pytest.raises(SerializationError, match="access_key_id and secret_access_key together"):
        configure_s3(access_key_id="only-this")
    with pytest.raises(SerializationError, match="http:// or https://"):
        configure_s3(endpoint="127.0.0.1:9000")
