"""benchmarks/bench_replace_override.py still runs (its numbers are for the docs, not for tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def test_replace_override_benchmark_runs_and_reports_every_variant() -> None:
    """A tiny run prints one row per variant, each with a time and a ratio to flax.struct."""
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_replace_override.py"), "--rounds=2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=BENCH,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith(("| flax", "| port"))]
    assert len(rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1].endswith(" us") and cells[2][0].isdigit(), row
