"""Struct's serialisation methods name the jaxstruct-io distribution when it is missing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jaxstruct.core as js
import pytest

# Runs in a fresh interpreter where importing jaxstruct.io fails, as when only
# jaxstruct-core is installed; prints one JSON record per method.
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["jaxstruct.io"] = None
    import jaxstruct.core as js

    class P(js.Struct):
        x: int = 0

    calls = {
        "to_state_dict": lambda: P().to_state_dict(),
        "from_state_dict": lambda: P.from_state_dict({}),
        "export": lambda: P().export("never-written"),
        "load": lambda: P.load("never-read"),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
        except Exception as err:
            out[name] = {
                "type": type(err).__name__,
                "import_error": isinstance(err, ImportError),
                "struct_error": isinstance(err, js.StructError),
                "message": str(err),
            }
        else:
            out[name] = None
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, object] | None]:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


METHODS = ["to_state_dict", "from_state_dict", "export", "load"]


@pytest.mark.parametrize("method", METHODS)
def test_method_raises_without_io(results: dict, method: str) -> None:
    """Without jaxstruct.io the method raises MissingDistributionError."""
    assert results[method] is not None
    assert results[method]["type"] == "MissingDistributionError"


@pytest.mark.parametrize("method", METHODS)
def test_error_names_the_distribution(results: dict, method: str) -> None:
    """The error message names the distribution to install, jaxstruct-io."""
    assert "jaxstruct-io" in results[method]["message"]


@pytest.mark.parametrize("method", METHODS)
def test_error_is_import_and_struct_error(results: dict, method: str) -> None:
    """The error is both an ImportError and a StructError."""
    assert results[method]["import_error"] and results[method]["struct_error"]


def test_struct_has_the_four_serialisation_methods() -> None:
    """Struct defines to_state_dict, from_state_dict, export and load."""
    for name in METHODS:
        assert callable(getattr(js.Struct, name))
