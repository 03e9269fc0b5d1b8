"""Private JAX APIs are used in one guarded module of jaxstruct.io, and nowhere else."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from jaxstruct.io import _jax_private

SOURCES = Path(__file__).resolve().parents[2] / "packages"


def test_jax_private_apis_sit_behind_one_module() -> None:
    """No module but jaxstruct.io._jax_private imports from jax._src."""
    users = sorted(
        str(path.relative_to(SOURCES))
        for path in SOURCES.glob("*/src/jaxstruct/**/*.py")
        if re.search(r"\bjax\._src\b", path.read_text())
    )
    assert users == ["io/src/jaxstruct/io/_jax_private.py"]


def test_the_seam_answers_none_when_jax_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each function gives its result, or None (the callers' cue for the public fallback)."""
    import jax
    import jax._src.lax.lax as lax_private

    weak = _jax_private.weakly_typed(jax.numpy.ones(3, np.float32))
    assert weak is not None and weak.weak_type and weak.dtype == np.float32
    assert _jax_private.distributed_client() is None  # jax.distributed not initialised
    arr = jax.numpy.ones(3)
    monkeypatch.delattr(lax_private, "_convert_element_type")
    assert _jax_private.weakly_typed(arr) is None


def test_the_placement_seam_matches_jax_device_put_or_answers_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``put_on_default_device`` places host arrays as jax.device_put does (uncommitted, on
    the default device, also under ``jax.default_device``), and answers None without XLA's
    batched put or JAX's default-device lookup."""
    import jax
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client  # pyright: ignore[reportPrivateImportUsage]

    hosts = [np.arange(4, dtype=np.float32) + i for i in range(3)] + [np.ones((2, 2), np.int8)]
    for device in (None, jax.devices()[2]):
        with jax.default_device(device):
            placed = _jax_private.put_on_default_device(hosts)
            references = [jax.device_put(host) for host in hosts]
        assert placed is not None
        for host, arr, reference in zip(hosts, placed, references, strict=True):
            assert (arr.aval, arr.sharding, arr.committed, arr.weak_type) == (
                reference.aval,
                reference.sharding,
                reference.committed,
                reference.weak_type,
            )
            np.testing.assert_array_equal(arr, host)
    # The lookups are made once per process: a JAX without them is one imported afresh.
    monkeypatch.delattr(pxla, "get_default_device")
    _jax_private._batched_put.cache_clear()
    assert _jax_private.put_on_default_device(hosts) is None
    monkeypatch.undo()
    monkeypatch.delattr(xla_client, "batched_device_put")
    _jax_private._batched_put.cache_clear()
    assert _jax_private.put_on_default_device(hosts) is None
    monkeypatch.undo()
    _jax_private._batched_put.cache_clear()
    assert _jax_private.put_on_default_device(hosts) is not None
