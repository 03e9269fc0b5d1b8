"""The pytest plugin (entry point ``pytest11``): round-trip checks as fixtures.

Kept free of heavy imports: pytest loads it at start-up in every session of
an environment where ``jaxstruct-testing`` is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = ["assert_pytree_roundtrip", "assert_roundtrip", "pytest_runtest_call"]

_GAVE_UP = ("FailedHealthCheck", "Unsatisfiable")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Add to a health-check or ``Unsatisfiable`` failure which classes refused draws, and why."""
    from ._refusals import health_note, reset_refusals

    reset_refusals()
    try:
        return (yield)
    except BaseException as err:
        if type(err).__name__ in _GAVE_UP and type(err).__module__ == "hypothesis.errors":
            note = health_note()
            if note is not None:
                err.add_note(note)
        raise
    finally:
        reset_refusals()


@pytest.fixture(name="assert_roundtrip")
def assert_roundtrip(tmp_path: Path) -> Callable[..., None]:
    """Fixture: ``assert_roundtrip(x, formats=...)`` writing its checkpoints under ``tmp_path``."""
    from ._assertions import assert_roundtrip as check

    counter = iter(range(1 << 62))

    def run(x: Any, **kwargs: Any) -> None:
        kwargs.setdefault("tmp_path", tmp_path / f"roundtrip-{next(counter)}")
        Path(kwargs["tmp_path"]).mkdir(parents=True, exist_ok=True)
        check(x, **kwargs)

    return run


@pytest.fixture(name="assert_pytree_roundtrip")
def assert_pytree_roundtrip() -> Callable[[Any], None]:
    """Fixture: :func:`jaxstruct.testing.assert_pytree_roundtrip`."""
    from ._assertions import assert_pytree_roundtrip as check

    return check
