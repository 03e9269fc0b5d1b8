"""examples/property_testing passes: its properties hold and its planted bugs are caught."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "property_testing"


@pytest.mark.xdist_group("multiprocess")
def test_property_testing_example_passes(tmp_path: Path) -> None:
    """The example's property tests and planted-bug tests all pass under pytest.

    The run's summary shows how long the LGSSM's planted transposed weight took
    to be found and shrunk (printed here too, so ``-s`` or a failure shows it).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOTHESIS")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(EXAMPLE.parents[1]),
            str(EXAMPLE),
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "17 passed" in result.stdout, result.stdout[-2000:]
    timings = result.stdout.partition("= timings =")[2]
    # The shrink's time is shown, not asserted (the machine may be busy); its result is.
    assert "transposed dynamics weight: found and shrunk to a (2, 2) weight" in timings
    print(timings.splitlines()[1])
