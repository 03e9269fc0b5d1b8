"""examples/train_resume.py, run as a user runs it: killed during a save, then resumed.

Each scenario trains in a fresh process, is killed with SIGKILL right after it
says it saves step 30 (saves are asynchronous: 20's or 30's is in flight), and
is run again with the same command: it must resume at the newest complete step
and finish with a state bit-identical to an uninterrupted run's (issue 20).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jaxstruct.io as jio
import numpy as np
import pytest

# Other libraries' pytrees: the peers group, absent only in the lowest-versions runs
# (where conftest allows the skip; everywhere else a missing peer fails the run).
for _peer in ("optax", "equinox", "flax"):
    pytest.importorskip(_peer)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_resume.py"
TIMEOUT = 240
FINAL = 50
SCENARIOS = [("mlp", "directory"), ("mlp", "orbax"), ("equinox", "orbax"), ("flax", "directory")]


def _run(args: list[str]) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the example asks for its 8 devices itself
    return env


def _run_until_killed(args: list[str], line: str) -> list[str]:
    """Start the example, SIGKILL it as soon as it prints ``line``; return what it printed."""
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )
    seen: list[str] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        assert proc.stdout is not None
        for text in proc.stdout:
            seen.append(text.strip())
            if text.strip() == line:
                proc.send_signal(signal.SIGKILL)
                break
            assert time.monotonic() < deadline, f"no {line!r} in time: {seen}"
    finally:
        proc.kill()
        proc.wait(timeout=TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()
    assert line in seen, seen
    return seen


def _checkpoint_bits(path: Path) -> tuple[object, dict[str, bytes]]:
    """A directory checkpoint's manifest and the bytes of each of its arrays."""
    # The reference runs in this process, where the example's classes live in another module.
    text = (path / "manifest.json").read_text().replace("train_resume_example:", "__main__:")
    manifest = json.loads(text)
    manifest.pop("checksum", None)  # of the bytes before the module names were replaced
    manifest.pop("seal", None)  # likewise
    with np.load(path / "arrays.npz") as arrays:
        return manifest, {name: arrays[name].tobytes() for name in arrays.files}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The final state of an uninterrupted run of each model (run here, with the same devices)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_resume_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    root = tmp_path_factory.mktemp("reference")
    out = {}
    for model in sorted({m for m, _ in SCENARIOS}):
        dump = root / f"{model}_final"
        # optax mixes Python floats with int32 counters: the suite's strict promotion is
        # for our code; the example runs under JAX's default, as in the subprocesses.
        with jax.numpy_dtype_promotion("standard"):
            example.main(
                [str(root / model), "--model", model, "--steps", str(FINAL), "--dump", str(dump)]
            )
        out[model] = dump
    return out


@pytest.mark.parametrize(("model", "fmt"), SCENARIOS, ids=[f"{m}-{f}" for m, f in SCENARIOS])
def test_killed_during_a_save_resumes_bit_exactly(
    model: str, fmt: str, tmp_path: Path, reference: dict[str, Path]
) -> None:
    """The resumed run starts at the newest complete step and ends where an unbroken one does."""
    run = tmp_path / "run"
    common = [str(run), "--model", model, "--format", fmt]
    _run_until_killed([*common, "--steps", "100000"], "saving step 30")
    # The saves of 20 and 30 may both have been in flight (a save waits for the one before).
    complete = jio.CheckpointManager(run, format=fmt).all_steps()
    assert complete and complete[-1] in (10, 20, 30), complete
    dump = tmp_path / "final"
    out = _run([*common, "--steps", str(FINAL), "--dump", str(dump)])
    assert out.splitlines()[0] == f"resumed at step {complete[-1]}", out
    assert f"done at step {FINAL}" in out
    assert _checkpoint_bits(dump) == _checkpoint_bits(reference[model])


def test_the_loop_docs_scale_shows_is_the_tested_one() -> None:
    """Every code block of docs/scale.md's training-loop section is in the example, verbatim."""
    import re

    page = (EXAMPLE.parents[1] / "docs" / "scale.md").read_text()
    section = page.split("## A training loop that resumes", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```py\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 2
    source = EXAMPLE.read_text()
    for block in blocks:
        assert block in source, block[:200]
