"""Checkpoints in Google Cloud Storage through the orbax format, against fake-gcs-server
started on 127.0.0.1 (a free port, a throwaway token, stopped afterwards)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._gcs import BUCKET, emulator_env, fake_gcs, objects

WORKER = Path(__file__).with_name("_gcs_worker.py")
TIMEOUT = 300


@pytest.fixture(scope="module")
def gcs_url() -> Iterator[str]:
    with fake_gcs() as url:
        yield url


def test_export_and_load_through_gcs(gcs_url: str) -> None:
    """Export (blocking and not), load (as stored, resharded, mesh=, select=), refusals."""
    env = {**os.environ, **emulator_env(gcs_url), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run(
        [sys.executable, str(WORKER), f"gs://{BUCKET}/run"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr[-3000:]
    stored = objects(gcs_url, "run/")
    assert "run/ck/jaxstruct/metadata" in stored, stored
    assert "run/async/jaxstruct/metadata" in stored, stored
    assert not any(name.startswith("run/builtin-") for name in stored), stored


@pytest.mark.parametrize("url", ["s3://bucket/ck", "memory://ck"])
def test_urls_orbax_cannot_store_to_are_refused_clearly(url: str) -> None:
    """orbax-checkpoint 0.12.8 builds array stores for local paths and gs:// only."""
    import jaxstruct.io as jio
    import numpy as np
    from jaxstruct.registry import SerializationError

    with pytest.raises(SerializationError, match=r"gs://\) only, not at"):
        jio.export({"w": np.ones(2)}, url, format="orbax")
    with pytest.raises(SerializationError, match=r"no registered format .* recognises"):
        jio.load(url)
