"""Type checkers accept typing_tests/accept_*.py and reject the marked lines of reject_*.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TYPING = ROOT / "typing_tests"
BIN = Path(sys.executable).parent
MARK = "# expected-error"


def _expected(path: Path) -> set[int]:
    lines = path.read_text().splitlines()
    return {i for i, line in enumerate(lines, start=1) if line.rstrip().endswith(MARK)}


def _pyright_errors() -> dict[str, set[int]]:
    proc = subprocess.run(
        [
            str(BIN / "pyright"),
            "--outputjson",
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


def _mypy_errors(*files: Path) -> dict[str, set[int]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-error-summary",
            "--show-absolute-path",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    out: dict[str, set[int]] = {}
    for match in re.finditer(r"^(.+?\.py):(\d+): error:", proc.stdout, re.MULTILINE):
        out.setdefault(Path(match.group(1)).name, set()).add(int(match.group(2)))
    return out


def _files(prefix: str) -> list[Path]:
    found = sorted(TYPING.glob(f"{prefix}_*.py"))
    assert found, f"no {prefix}_*.py files in {TYPING}"
    return found


def test_pyright_accepts_and_rejects_exactly_the_marked_lines() -> None:
    """Pyright reports no error in accept files and exactly the marked lines in reject files."""
    errors = _pyright_errors()
    for path in _files("accept"):
        assert errors.get(path.name, set()) == set(), path.name
    for path in _files("reject"):
        assert errors.get(path.name, set()) == _expected(path), path.name


def test_mypy_accepts_and_rejects_exactly_the_marked_lines() -> None:
    """Mypy reports no error in accept files and exactly the marked lines in reject files."""
    accept, reject = _files("accept"), _files("reject")
    errors = _mypy_errors(*accept, *reject)
    for path in accept:
        assert errors.get(path.name, set()) == set(), path.name
    for path in reject:
        assert errors.get(path.name, set()) == _expected(path), path.name


def test_reject_files_mark_errors() -> None:
    """Every reject file marks at least one line, so an empty checker run cannot pass."""
    for path in _files("reject"):
        assert _expected(path), path.name
