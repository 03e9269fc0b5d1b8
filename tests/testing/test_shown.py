"""A failing example shows the values of small arrays."""

import jax
import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.reporting import with_reporter
from jaxstruct.testing import structs
from jaxtyping import Array, Int


class Counter(js.Struct):
    # jaxtyping's shape strings are not forward references (F722 misreads them).
    count: Int[Array, ""]  # noqa: F722
    history: np.ndarray = js.field(default_factory=lambda: np.zeros(40))
    key: jax.Array = jax.random.key(0)


class Run(js.Struct):
    counter: Counter


def test_failing_example_shows_small_array_values() -> None:
    """The printed failing example has the failing counter's value, not just int8[]."""
    lines: list[str] = []

    @settings(database=None, max_examples=200)
    @given(structs(Run))
    def test(run: Run) -> None:
        assert int(run.counter.count) < 100

    with with_reporter(lines.append), pytest.raises(AssertionError) as info:
        test()
    printed = "\n".join(lines + list(getattr(info.value, "__notes__", [])))
    assert "Run(counter=Counter(count=jnp.asarray(100, dtype=" in printed
    assert "(key data [" in printed
    assert "history=np.asarray(" in printed or "(too big to show)" in printed
