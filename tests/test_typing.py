"""Type checkers accept typing_tests/accept_*.py and reject the marked lines of reject_*.py.

Three runs check every file: mypy (with ``jaxstruct.core.mypy_plugin``, as
typing_tests/mypy.ini enables it), pyright with ``pythonVersion`` 3.11 and
pyright with 3.13 (from 3.13 on pyright synthesises ``__replace__``, from which
``Struct.replace`` is typed). A file whose docstring has a line
``typing-runs: mypy, pyright-3.13`` is checked by those runs only. A rejected
line ends with ``# expected-error`` (every run checking the file must report an
error there) or ``# expected-error[mypy,pyright-3.13]`` (only those runs).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TYPING = ROOT / "typing_tests"
BIN = Path(sys.executable).parent
RUNS = ("mypy", "pyright-3.11", "pyright-3.13")
MARK = re.compile(r"# expected-error(?:\[([\w.,\- ]+)\])?\s*$")
RUNS_LINE = re.compile(r"^typing-runs:\s*(.+)$", re.M)


def _runs_of(path: Path) -> tuple[str, ...]:
    found = RUNS_LINE.search(path.read_text())
    if found is None:
        return RUNS
    runs = tuple(r.strip() for r in found.group(1).split(","))
    assert set(runs) <= set(RUNS), f"{path.name}: unknown run in {runs}; runs are {RUNS}"
    return runs


def _expected(path: Path, run: str) -> set[int]:
    lines = path.read_text().splitlines()
    out = set()
    for number, line in enumerate(lines, start=1):
        mark = MARK.search(line)
        if mark is None:
            continue
        runs = RUNS if mark.group(1) is None else [r.strip() for r in mark.group(1).split(",")]
        assert set(runs) <= set(RUNS), f"{path.name}:{number}: unknown run in {runs}"
        if run in runs:
            out.add(number)
    return out


@functools.cache
def _pyright_errors(version: str) -> dict[str, set[int]]:
    proc = subprocess.run(
        [
            str(BIN / "pyright"),
            "--outputjson",
            "--pythonversion",
            version,
            "--project",
            str(TYPING / "pyrightconfig.json"),
            # The packages installed for this interpreter, whichever venv runs the suite.
            "--pythonpath",
            sys.executable,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    report = json.loads(proc.stdout)
    out: dict[str, set[int]] = {}
    for diag in report["generalDiagnostics"]:
        if diag["severity"] == "error":
            name = Path(diag["file"]).name
            out.setdefault(name, set()).add(diag["range"]["start"]["line"] + 1)
    return out


@functools.cache
def _mypy_errors() -> dict[str, set[int]]:
    files = [p for p in sorted(TYPING.glob("*_*.py")) if "mypy" in _runs_of(p)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(TYPING / "mypy.ini"),
            "--no-error-summary",
            "--show-absolute-path",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 2 = mypy crashed or misused
    out: dict[str, set[int]] = {}
    for match in re.finditer(r"^(.+?\.py):(\d+): error:", proc.stdout, re.MULTILINE):
        out.setdefault(Path(match.group(1)).name, set()).add(int(match.group(2)))
    return out


def _errors(run: str) -> dict[str, set[int]]:
    if run == "mypy":
        return _mypy_errors()
    return _pyright_errors(run.removeprefix("pyright-"))


def _files(prefix: str, run: str) -> list[Path]:
    found = [p for p in sorted(TYPING.glob(f"{prefix}_*.py")) if run in _runs_of(p)]
    assert found, f"no {prefix}_*.py files for {run} in {TYPING}"
    return found


@pytest.mark.parametrize("run", RUNS)
def test_accept_files_have_no_errors(run: str) -> None:
    """Each checker run reports no error in the accept files it checks."""
    errors = _errors(run)
    for path in _files("accept", run):
        assert errors.get(path.name, set()) == set(), (run, path.name)


@pytest.mark.parametrize("run", RUNS)
def test_reject_files_flag_exactly_the_marked_lines(run: str) -> None:
    """Each checker run reports errors on exactly the lines marked for it, no others."""
    errors = _errors(run)
    for path in _files("reject", run):
        assert errors.get(path.name, set()) == _expected(path, run), (run, path.name)


def test_reject_files_mark_errors() -> None:
    """Every reject file marks a line for each run checking it, so an empty run cannot pass."""
    for path in sorted(TYPING.glob("reject_*.py")):
        for run in _runs_of(path):
            assert _expected(path, run), (path.name, run)


def test_replace_typo_is_rejected_by_mypy_and_pyright_313() -> None:
    """The issue's two examples, ``replace(typo=1)`` and a wrong type, are rejected."""
    source = (TYPING / "reject_replace.py").read_text().splitlines()
    typo = 1 + next(i for i, line in enumerate(source) if "replace(typo=1)" in line)
    wrong = 1 + next(i for i, line in enumerate(source) if "replace(act=3)" in line)
    for run in ("mypy", "pyright-3.13"):
        assert {typo, wrong} <= _errors(run).get("reject_replace.py", set()), run
