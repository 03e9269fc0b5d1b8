"""examples/demo.py, the README's first command, runs end to end in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def test_the_demo_runs_and_its_checkpoints_load_equal() -> None:
    """The demo trains, edits, validates and round-trips its state through both formats."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, str(DEMO)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "exported and loaded step_200: equal = True" in out.stdout
    assert "exported and loaded step_200.zip: equal = True" in out.stdout
