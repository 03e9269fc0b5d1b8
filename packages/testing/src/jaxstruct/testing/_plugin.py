"""The pytest plugin (entry point ``pytest11``): round-trip checks as fixtures.

Kept free of heavy imports: pytest loads it at start-up in every session of
an environment where ``jaxstruct-testing`` is installed.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["assert_pytree_roundtrip", "assert_roundtrip", "pytest_runtest_call"]

_GAVE_UP = ("FailedHealthCheck", "Unsatisfiable")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Report the struct classes that refused a large share of a test's draws, and why.

    A test that passes gets a :class:`~jaxstruct.testing.RefusalWarning` (shown
    in pytest's warnings summary; under ``-W error`` it fails the test); a
    test that fails gets the report as a note, and a health-check or
    ``Unsatisfiable`` failure always names the classes that refused draws.
    """
    from ._refusals import RefusalWarning, health_note, refusal_report, reset_refusals

    reset_refusals()
    try:
        result = yield
        report = refusal_report()
        if report is not None:
            # Attributed to the test function, not to this plugin.
            _, line, _ = item.location
            warnings.warn_explicit(report, RefusalWarning, str(item.path), (line or 0) + 1)
        return result
    except RefusalWarning:
        raise
    except BaseException as err:
        gave_up = type(err).__name__ in _GAVE_UP and type(err).__module__ == "hypothesis.errors"
        note = health_note() if gave_up else refusal_report()
        if note is not None:
            err.add_note(note)
        raise
    finally:
        reset_refusals()


# Both fixtures are session-scoped: they hold no per-test state, so a test
# under @given may use them without Hypothesis' function_scoped_fixture health
# check (which warns that function-scoped fixtures are not reset per example).
@pytest.fixture(name="assert_roundtrip", scope="session")
def assert_roundtrip(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., None]:
    """Fixture: ``assert_roundtrip(x, formats=...)``, each call in a fresh temporary directory.

    The directory is removed when the check passes and kept (under pytest's
    base temporary directory) when it fails, to look at the checkpoint.
    """
    from ._assertions import assert_roundtrip as check

    def run(x: Any, **kwargs: Any) -> None:
        if "tmp_path" in kwargs:
            check(x, **kwargs)
            return
        where = tmp_path_factory.mktemp("roundtrip")
        check(x, tmp_path=where, **kwargs)
        shutil.rmtree(where, ignore_errors=True)

    return run


@pytest.fixture(name="assert_pytree_roundtrip", scope="session")
def assert_pytree_roundtrip() -> Callable[[Any], None]:
    """Fixture: :func:`jaxstruct.testing.assert_pytree_roundtrip`."""
    from ._assertions import assert_pytree_roundtrip as check

    return check
