"""structs(): only deliberate refusals discard a draw, and they say which class and why."""

import subprocess
import sys
import textwrap
from pathlib import Path

import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from hypothesis.reporting import with_reporter
from jaxstruct.testing import structs
from jaxstruct.testing._refusals import (
    record_attempt,
    record_refusal,
    refusal_report,
    reset_refusals,
)


class Normalised(js.Struct):
    w: np.ndarray

    def __post_init__(self) -> None:
        self.w = self.w / self.w.reshape(-1)[0]  # IndexError when w is empty: a bug


class Broken(js.Struct):
    n: int

    def __post_init__(self) -> None:
        raise AttributeError("no attribute 'm'")  # always: a bug


def _run(strategy: st.SearchStrategy[object], **kw: object) -> None:
    kw.setdefault("max_examples", 50)

    @settings(database=None, **kw)  # type: ignore[arg-type]
    @given(strategy)
    def test(x: object) -> None:
        pass

    test()


def test_post_init_bug_fails_the_test() -> None:
    """An IndexError in __post_init__ fails the test with the user's traceback."""
    with pytest.raises(IndexError) as info:
        _run(structs(Normalised, w=st.sampled_from([np.ones(2), np.ones(0)])))
    assert any(entry.name == "__post_init__" for entry in info.traceback)


def test_post_init_attribute_error_fails_the_test() -> None:
    """An AttributeError raised by every construction fails, not a health check."""
    with pytest.raises(AttributeError, match="no attribute 'm'"):
        _run(structs(Broken))


def _odd(n: int) -> None:
    if n % 2 == 0:
        raise ValueError(f"{n} is even")


class Refusing(js.Struct):
    n: int = js.field(validator=_odd)
    lo: int = 0
    hi: int = 0

    def __post_init__(self) -> None:
        if self.lo > 5:
            raise js.ValidationError("Refusing.lo: too big")

    def __check_init__(self) -> None:
        if self.lo > self.hi:
            raise ValueError(f"lo {self.lo} > hi {self.hi}")


# Refuses about half its draws on purpose: the end-of-test report is expected.
@pytest.mark.filterwarnings("ignore::jaxstruct.testing.RefusalWarning")
@settings(max_examples=30)
@given(structs(Refusing, lo=st.integers(0, 7), hi=st.integers(0, 7)))
def test_deliberate_refusals_are_discarded(x: Refusing) -> None:
    """ValueError from a validator or __check_init__, ValidationError anywhere: discarded."""
    assert x.n % 2 == 1 and x.lo <= x.hi and x.lo <= 5


@pytest.mark.filterwarnings("ignore::jaxstruct.testing.RefusalWarning")
def test_refusals_are_reported_with_class_field_and_message() -> None:
    """At debug verbosity each refusal names the class, the field and the message."""
    lines: list[str] = []
    with with_reporter(lines.append), pytest.raises(Unsatisfiable):
        _run(
            structs(Refusing, n=st.just(2)),
            verbosity=Verbosity.debug,
            max_examples=3,
            suppress_health_check=list(HealthCheck),
        )
    assert any("Refusing refused a draw: Refusing.n: validator '_odd'" in line for line in lines)
    assert any("raised ValueError: 2 is even" in line for line in lines)


def test_health_check_failure_names_the_class_and_reasons(tmp_path: Path) -> None:
    """Under pytest, a health-check failure gets a note naming the class and its refusals."""
    test_file = tmp_path / "test_refused.py"
    test_file.write_text(
        textwrap.dedent(
            """
            import jaxstruct.core as js
            from hypothesis import given, settings
            from jaxstruct.testing import structs

            class Cfg(js.Struct):
                n_chains: int

                def __check_init__(self):
                    if self.n_chains != 12345:
                        raise ValueError(f"n_chains must be 12345, got {self.n_chains}")

            @settings(database=None)
            @given(structs(Cfg))
            def test_cfg(cfg):
                pass
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout
    assert "FailedHealthCheck" in result.stdout or "Unsatisfiable" in result.stdout
    assert "structs() discarded draws its classes refused: Cfg" in result.stdout
    assert "Cfg: Cfg.__check_init__ raised ValueError: n_chains must be 12345" in result.stdout


_OVER_STRICT = """
import jaxstruct.core as js
from hypothesis import given, settings
from jaxstruct.testing import structs

class Config(js.Struct):
    n_layers: int = js.field(static=True, validator=lambda n: 1 <= n <= 3)
    d_model: int = js.field(static=True, validator=lambda d: 1 <= d <= 64)

    def __post_init__(self):
        if self.n_layers == 1:  # the planted bug: one layer is a valid config
            raise js.ValidationError(f"n_layers must be > 1, got {self.n_layers}")

@settings(database=None, max_examples=60)
@given(structs(Config))
def test_config(config):
    assert config.n_layers >= 1
"""


def _pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "test_user.py"
    test_file.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(test_file)],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )


def test_over_strict_post_init_is_reported_when_the_test_passes(tmp_path: Path) -> None:
    """A class refusing over 10% of its draws gets a warning naming it, the share and why."""
    result = _pytest(tmp_path, _OVER_STRICT)
    assert result.returncode == 0, result.stdout
    assert "RefusalWarning" in result.stdout
    assert "Config refused" in result.stdout and "draws (" in result.stdout
    assert "Config.__post_init__ raised ValidationError: n_layers must be > 1" in result.stdout
    assert "test_user.py" in result.stdout.split("warnings summary")[1]


def test_over_strict_post_init_fails_under_warnings_as_errors(tmp_path: Path) -> None:
    """Under -W error the report fails the test, naming the class and the refusal."""
    result = _pytest(tmp_path, _OVER_STRICT, "-W", "error")
    assert result.returncode == 1, result.stdout
    assert "RefusalWarning" in result.stdout
    assert "n_layers must be > 1" in result.stdout


def test_rare_refusals_are_not_reported() -> None:
    """A class refusing a few of its draws passes quietly (warnings are errors here)."""

    @settings(database=None, max_examples=60)
    @given(structs(Refusing, n=st.sampled_from([1, 3, 5]), lo=st.just(0), hi=st.just(0)))
    def test(x: Refusing) -> None:
        pass

    test()  # no refusal at all: nothing to report
    reset_refusals()
    for i in range(100):
        record_attempt(Refusing)
        if i < 10:
            record_refusal(Refusing, "Refusing.n: rare")
    assert refusal_report() is None  # 10%: at the threshold, not over it
    record_attempt(Refusing)
    record_refusal(Refusing, "Refusing.n: rare")
    assert "Refusing refused 11 of 101 draws (11%)" in (refusal_report() or "")
    reset_refusals()
