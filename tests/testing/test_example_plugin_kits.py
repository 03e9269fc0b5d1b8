"""The example plugins' own test suites, one kit class each, run in this suite too (with
its eight CPU devices, so sharded arrays are tested), as `pytest examples/plugin_*/tests`
runs them in a plugin's repository."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _tests_of(plugin: str, module: str) -> ModuleType:
    path = EXAMPLES / plugin / "tests" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(f"examples_{plugin}_{module}", path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


_tar = _tests_of("plugin_tar", "test_tar_format")
_datetime = _tests_of("plugin_datetime", "test_datetime_codecs")

TestTar = _tar.TestTar
TestDatetime = _datetime.TestDatetime
TestDate = _datetime.TestDate
TestTime = _datetime.TestTime
TestTimedelta = _datetime.TestTimedelta
TestDecimal = _datetime.TestDecimal
