"""`inspect` of an orbax checkpoint without a jaxstruct manifest (orbax's own
``StandardCheckpointer`` wrote it): consistent with what ``load`` does with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import jaxstruct.io as jio
import orbax.checkpoint as ocp
import pytest
from jaxstruct.io._cli import main
from jaxstruct.registry import SerializationError


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    state: dict[str, Any] = {
        "params": {"w": jnp.ones((2, 3), jnp.float32), "layers": [{"b": jnp.zeros(4)}]},
        "step": jnp.array(7, jnp.int32),
    }
    path = (tmp_path / "plain").absolute()
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()
    checkpointer.close()
    return path


def test_inspect_lists_the_arrays_of_a_plain_orbax_checkpoint(plain: Path) -> None:
    """Its arrays by tree path, no manifest, no checksums, and a note asking for a target."""
    info = jio.inspect(plain)
    assert info.container == "orbax" and not info.has_manifest and info.version is None
    assert info.arrays == {
        "params.layers.0.b": ("<f4", (4,), 16),
        "params.w": ("<f4", (2, 3), 24),
        "step": ("<i4", (), 4),
    }
    assert info.checksums == "none checked by jaxstruct: written by another tool (orbax itself)"
    assert "load(path, target=...)" in info.note and "as a dict" not in info.note
    assert "  params.w: <f4[2, 3] 24 B" in str(info)


def test_load_without_a_target_still_asks_for_one(plain: Path) -> None:
    """As the note says: orbax's tree may hold leaves that are not arrays, so no flat dict."""
    with pytest.raises(
        SerializationError,
        match=r"orbax checkpoint has no jaxstruct manifest.*pass target=.*jaxstruct inspect PATH",
    ):
        jio.load(plain)


def test_cli_verify_of_a_plain_orbax_checkpoint(
    plain: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--verify restores every array, says that no checksums were checked and exits 3."""
    assert main(["inspect", str(plain), "--json", "--verify"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["has_manifest"] is False and report["arrays"]["step"]["shape"] == []
    assert report["verify"] == {"ok": True, "problems": [], "checksums": False}
