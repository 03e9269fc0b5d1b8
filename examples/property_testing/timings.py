"""Timings the tests report (not assert): shown in pytest's summary at the end of the run."""

from __future__ import annotations

#: The lines to show, in the order they were reported.
REPORTED: list[str] = []


def report(line: str) -> None:
    """Show ``line`` in the "timings" section of the run's summary."""
    REPORTED.append(line)
