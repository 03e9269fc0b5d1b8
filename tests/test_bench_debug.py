"""benchmarks/bench_debug.py still runs (its numbers are for the docs, not for tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def test_debug_benchmark_runs_and_reports_ratios() -> None:
    """A tiny run prints one ratio row per model and the wrapper's own cost."""
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_debug.py"), "--rounds=2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=BENCH,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith(("| flat", "| nested"))]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2][0].isdigit() and cells[3][0].isdigit(), row
    assert "Wrapper cost per call" in out
