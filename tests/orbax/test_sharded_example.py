"""examples/sharded.py runs: manager save of a sharded train state, restore into a new mesh."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sharded.py"


@pytest.mark.parametrize("fmt", ["orbax", "zip"])
def test_sharded_example_runs(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example trains, saves two kept steps and restores them onto another mesh."""
    monkeypatch.setenv("XLA_FLAGS", "")  # the example edits it; restored afterwards
    spec = importlib.util.spec_from_file_location("sharded_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path / "run", fmt)
    out = capsys.readouterr().out
    assert "saved steps: [2, 3]" in out and "restored TrainState at step 3" in out
