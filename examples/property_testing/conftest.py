"""Makes the example's modules importable, loads the Hypothesis profile, shows timings."""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timings import REPORTED

# The profiles of jaxstruct's own suite: 40 examples a property in CI, deadline off
# (the first call of jitted code with a new shape compiles, which takes its time).
settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Show the timings the tests reported (how long a shrink took), whatever the outcome."""
    if REPORTED:
        terminalreporter.section("timings")
        for line in REPORTED:
            terminalreporter.write_line(line)
