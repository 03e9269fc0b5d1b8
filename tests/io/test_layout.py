"""The on-disk layout: legacy checkpoints still load; the zip holds the directory's two files."""

from __future__ import annotations

from pathlib import Path

import jax
import jaxstruct.io as jio
import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"


def _check_legacy(value: dict) -> None:
    assert value["step"] == 7 and value["name"] == "legacy"
    np.testing.assert_array_equal(value["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert isinstance(value["b"], jax.Array) and value["b"].tolist() == [1, 2, 3]
    assert value["z"].shape == (1000,) and not value["z"].any()
    assert value["nested"] == [1.5, None, (True, "x")]


def test_legacy_zip_with_flat_npy_members_loads() -> None:
    """A zip written by the first layout (manifest.json beside <key>.npy members) still loads."""
    _check_legacy(jio.load(FIXTURES / "legacy_v1.zip"))


def test_legacy_directory_loads() -> None:
    """A directory checkpoint written by the first release still loads."""
    _check_legacy(jio.load(FIXTURES / "legacy_v1_dir"))
