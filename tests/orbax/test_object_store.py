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
    out = subprocess.run(
        [sys.executable, str(WORKER), f"{store.root}/run"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr[-3000:]
    stored = store.objects("run/")
    assert "run/ck/jaxstruct/metadata" in stored, stored
    assert "run/ck/commit_success.txt" in stored, stored  # committed by a marker, no rename
    assert not any(".orbax-checkpoint-tmp" in name for name in stored), stored
    assert any(name.startswith("run/ck/arrays/ocdbt.process_0/d/") for name in stored), stored
    assert "run/async/jaxstruct/metadata" in stored, stored
    assert not any(name.startswith("run/builtin-") for name in stored), stored


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
