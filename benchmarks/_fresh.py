"""Run one benchmark job in a fresh Python process and return what it printed.

A fresh process is how a user meets the library: nothing imported, warmed or
allocated beforehand, and a peak (``VmHWM``) that belongs to this job alone.
The script is started as ``python SCRIPT --child JOB`` and must print the JSON
of its result as the last line of its standard output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_child(script: Path, job: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    """Run ``script --child JOB`` in a new interpreter; return its last printed line, parsed.

    ``env`` adds variables to the parent's environment. A child that fails raises
    ``RuntimeError`` with the end of its standard error and the job it ran.
    """
    out = subprocess.run(
        [sys.executable, str(script), "--child", json.dumps(job)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child {job} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
