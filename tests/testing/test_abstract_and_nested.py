"""structs(): abstract bases, nested struct fields and fields no draw can satisfy."""

import abc

import jaxstruct.core as js
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxstruct.testing import structs


class Layer(js.Struct, abstract=True):
    width: int = js.field(static=True, default=2)


class Dense(Layer):
    w: np.ndarray = js.field(kw_only=True)


class Conv(Layer):
    kernel: int = js.field(static=True, default=3)


@settings(max_examples=30)
@given(structs(Layer), st.from_type(Layer))
def test_abstract_keyword_draws_concrete_subclasses(a: Layer, b: Layer) -> None:
    """A class declared abstract=True is drawn as its concrete subclasses, never itself."""
    assert type(a) in (Dense, Conv) and type(b) in (Dense, Conv)


class Model(js.Struct):
    @abc.abstractmethod
    def energy(self) -> float: ...


class Jastrow(Model):
    n_sites: int = js.field(static=True, default=2)

    def energy(self) -> float:
        return 0.0


class Rbm(Model):
    alpha: int = js.field(static=True, default=1)

    def energy(self) -> float:
        return 1.0


def test_misspelt_override_on_abstract_base_is_a_type_error() -> None:
    """An override no concrete subclass takes is a TypeError naming it."""
    with pytest.raises(TypeError, match=r"'n_site' is not a field the constructor of any"):
        structs(Model, n_site=st.just(3))


@settings(max_examples=20)
@given(structs(Model, n_sites=st.just(5), alpha=st.just(4)))
def test_override_on_abstract_base_reaches_the_subclasses_having_it(m: Model) -> None:
    """Each override goes to the concrete subclasses that have the field."""
    if isinstance(m, Jastrow):
        assert m.n_sites == 5
    else:
        assert isinstance(m, Rbm) and m.alpha == 4


class Ids(js.Struct):
    ids: list[int] = js.field(static=True)


def test_never_hashable_static_field_is_a_type_error() -> None:
    """A static field annotated list[int] makes structs() raise a TypeError naming it."""
    with pytest.raises(TypeError, match=r"static field 'ids' is annotated list\[int\]"):
        structs(Ids)


@settings(max_examples=5)
@given(structs(Ids, ids=st.just((1, 2))))
def test_never_hashable_static_field_may_be_overridden(x: Ids) -> None:
    """An override for such a field is used instead of raising."""
    assert x.ids == (1, 2)


def test_nested_struct_fields_use_registered_strategies() -> None:
    """A strategy registered for a struct class is used for fields holding it."""

    class Sampler(js.Struct):
        x: np.ndarray

    class Train(js.Struct):
        sampler: Sampler
        samplers: tuple[Sampler, ...]

    marked = Sampler(x=np.array([42.0]))
    st.register_type_strategy(Sampler, st.just(marked))

    @settings(max_examples=10)
    @given(structs(Train))
    def test(t: Train) -> None:
        assert t.sampler is marked
        assert all(s is marked for s in t.samplers)

    test()
