"""__check_init__ invariants: every class's own hook runs after construction and replace."""

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest


class Positive(js.Struct):
    x: float

    def __check_init__(self):
        if self.x <= 0:
            raise ValueError(f"x must be positive, got {self.x}")


class Bounded(Positive):
    limit: float = 10.0

    def __check_init__(self):
        if self.x > self.limit:
            raise ValueError("x exceeds limit")


def test_check_init_runs_on_construction():
    """A failing invariant raises from the constructor."""
    with pytest.raises(ValueError, match="positive"):
        Positive(x=-1.0)


def test_check_init_runs_on_replace():
    """replace() runs the invariants again."""
    with pytest.raises(ValueError, match="positive"):
        Positive(x=1.0).replace(x=0.0)


def test_parent_check_runs_even_when_subclass_defines_its_own():
    """A subclass cannot skip the parent's invariant by forgetting super()."""
    with pytest.raises(ValueError, match="positive"):
        Bounded(x=-1.0)
    with pytest.raises(ValueError, match="limit"):
        Bounded(x=20.0)


def test_checks_run_base_first():
    """Invariants run in MRO order, base class first."""
    log = []

    class A(js.Struct):
        x: int

        def __check_init__(self):
            log.append("A")

    class B(A):
        def __check_init__(self):
            log.append("B")

    B(x=1)
    assert log == ["A", "B"]


def test_inherited_check_runs_once():
    """A check inherited without redefinition runs once per construction."""
    log = []

    class A(js.Struct):
        x: int

        def __check_init__(self):
            log.append(self.x)

    class C(A):
        y: int = 0

    C(x=1)
    assert log == [1]


def test_check_init_not_run_on_unflatten():
    """Unflattening (tree_map, jit) never runs the invariant: leaves may be tracers or sentinels."""
    p = Positive(x=jnp.float32(1.0))
    negated = jax.tree_util.tree_map(lambda v: -v, p)
    assert float(negated.x) == -1.0


def test_check_init_sees_a_frozen_instance():
    """Assigning a field inside __check_init__ raises FrozenStructError."""

    class Mutating(js.Struct):
        x: int

        def __check_init__(self):
            self.x = 2

    with pytest.raises(js.FrozenStructError, match="frozen"):
        Mutating(x=1)


def test_check_init_runs_after_post_init_and_user_init():
    """Invariants see the values __post_init__ and a hand-written __init__ produced."""

    class WithInit(js.Struct):
        x: int

        def __init__(self, half: int):
            self.x = 2 * half

        def __check_init__(self):
            assert self.x % 2 == 0

    assert WithInit(3).x == 6
