"""The plugin kit (issue 47): FormatTests and CodecTests pass a format written from the
docs' minimum and fail every sloppy plugin, each with a message naming what it breaks.

The sloppy plugins (``fixtures/sloppy_plugins.py``) each break one promise. One pytest
run, in this process, puts all of them through the kit (as a plugin's suite would); the
tests below read its outcomes.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
from jaxstruct.testing import FormatTests

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
_spec = importlib.util.spec_from_file_location("sloppy_plugins", FIXTURES / "sloppy_plugins.py")
assert _spec is not None and _spec.loader is not None
sloppy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sloppy)


def _docs_minimum() -> types.ModuleType:
    """The format of docs/plugins.md's first format example, as a module."""
    page = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    (source,) = [b for b in blocks if "class RawDirFormat(Format)" in b]
    module = types.ModuleType("docs_minimum_format")
    exec(compile(textwrap.dedent(source), "docs/plugins.md", "exec"), module.__dict__)
    return module


class TestDocsMinimum(FormatTests):
    """A format with only write, sniff, open and read_arrays, as docs/plugins.md writes it."""

    format = _docs_minimum().RawDirFormat()


def _suite() -> tuple[str, list[str]]:
    """A plugin test suite putting every sloppy plugin through the kit, and the tests to
    run: for each sloppy plugin the test that should catch it, and the same test on the
    sound plugin the sloppy ones are changed from (each failure is the change's)."""
    lines = [
        "import datetime as dt, decimal, fractions",
        "from hypothesis import strategies as st",
        "from jaxstruct.testing import CodecTests, FormatTests",
        "from sloppy_plugins import *",
        "class TestBase(FormatTests):\n    format = Base()\n",
        "class TestSOUND_FRACTION(CodecTests):\n    codec = SOUND_FRACTION\n"
        "    examples = [fractions.Fraction(-1, 3)]\n    strategy = st.fractions()\n",
    ]
    tests = []
    for name, (test, _) in sloppy.SLOPPY_FORMATS.items():
        lines.append(f"class Test{name}(FormatTests):\n    format = {name}()\n")
        tests += [f"Test{name}::{test}", f"TestBase::{test}"]
    for name, (examples, strategy, test, _) in sloppy.SLOPPY_CODECS.items():
        lines.append(
            f"class Test{name}(CodecTests):\n    codec = {name}\n    examples = {examples}\n"
            f"    strategy = {strategy}\n    max_examples = 30\n"
        )
        tests += [f"Test{name}::{test}", f"TestSOUND_FRACTION::{test}"]
    return "\n\n".join(lines), sorted(set(tests))


class _Reports:
    """What each test class did: ``class -> {test name: failure text or "passed"}``."""

    def __init__(self) -> None:
        self.outcomes: dict[str, dict[str, str]] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        _, owner, test = report.nodeid.split("::")
        done = self.outcomes.setdefault(owner, {})
        if report.failed:
            done[test] = report.longreprtext
        elif report.when == "call" and report.passed:
            done.setdefault(test, "passed")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> _Reports:
    """Run the sloppy plugins' suite once (in this process) and keep every report."""
    where = tmp_path_factory.mktemp("sloppy-suite")
    source, tests = _suite()
    (where / "sloppy_plugins.py").write_text((FIXTURES / "sloppy_plugins.py").read_text())
    (where / "test_sloppy_suite.py").write_text(source)
    (where / "pytest.ini").write_text("[pytest]\n")
    reports = _Reports()
    modules, path = set(sys.modules), list(sys.path)
    args = [str(where / f"test_sloppy_suite.py::{test}") for test in tests]
    options = [
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        "-c",
        str(where / "pytest.ini"),
        "--tb=short",
    ]
    try:
        pytest.main([*args, *options], plugins=[reports])
    finally:
        for name in set(sys.modules) - modules:
            del sys.modules[name]
        sys.path[:] = path
    return reports


@pytest.mark.parametrize("name", sorted(sloppy.SLOPPY_FORMATS))
def test_a_sloppy_format_fails_the_kit_naming_its_problem(outcomes: _Reports, name: str) -> None:
    """Each sloppy format fails a FormatTests test with a message naming what it breaks,
    a test the sound format it is changed from passes."""
    test, words = sloppy.SLOPPY_FORMATS[name]
    assert outcomes.outcomes["TestBase"][test] == "passed"
    failure = outcomes.outcomes[f"Test{name}"][test]
    assert failure != "passed", f"{name} passed {test}"
    assert words in failure, (words, failure[-1500:])


@pytest.mark.parametrize("name", sorted(sloppy.SLOPPY_CODECS))
def test_a_sloppy_codec_fails_the_kit_naming_its_problem(outcomes: _Reports, name: str) -> None:
    """Each sloppy codec fails a CodecTests test with a message naming what it breaks, a
    test a sound codec passes."""
    _, _, test, words = sloppy.SLOPPY_CODECS[name]
    assert outcomes.outcomes["TestSOUND_FRACTION"][test] == "passed"
    failure = outcomes.outcomes[f"Test{name}"][test]
    assert failure != "passed", f"{name} passed {test}"
    assert words in failure, (words, failure[-1500:])
