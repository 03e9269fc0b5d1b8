"""Named sizes are shared with nested structs, and may be bound to a nested struct's int field."""

from __future__ import annotations

import jaxstruct.core as js
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxstruct.testing import structs
from jaxtyping import Array, BFloat16, Float, Key

SETTINGS = settings(max_examples=30, database=None, deadline=None)


class Config(js.Struct):
    d_model: int = js.field(static=True, validator=lambda d: d >= 1)
    n_layers: int = js.field(static=True, validator=lambda n: 1 <= n <= 4)
    vocab: int = js.field(static=True, default=7)


class Params(js.Struct):
    embed: BFloat16[Array, "vocab d"]  # noqa: F722
    blocks: BFloat16[Array, "layers d d"]  # noqa: F722


class TrainState(js.Struct):
    config: Config
    params: Params
    key: Key[Array, ""]  # noqa: F722

    def __check_init__(self) -> None:
        c = self.config
        if self.params.blocks.shape != (c.n_layers, c.d_model, c.d_model):
            raise ValueError(f"blocks {self.params.blocks.shape} do not follow {c}")


@SETTINGS
@given(structs(TrainState, sizes={"d": "config.d_model", "layers": "config.n_layers"}))
def test_a_config_field_sizes_the_params_beside_it(state: TrainState) -> None:
    """sizes={"d": "config.d_model"}: the nested int is drawn small, and every d follows it."""
    assert state.params.blocks.shape[0] == state.config.n_layers
    assert state.params.embed.shape[1] == state.config.d_model <= 3


class Layer(js.Struct):
    x: Float[Array, " d"]  # noqa: F722
    inner: Params


@SETTINGS
@given(structs(Layer, sizes=(1, 2, 3)))
def test_nested_structs_share_named_sizes(layer: Layer) -> None:
    """A named size means the same in a nested struct's annotations as in its parent's."""
    assert layer.x.shape[0] == layer.inner.embed.shape[1] == layer.inner.blocks.shape[2]


class Pair(js.Struct):
    inner: Layer
    a: Float[Array, " d"]  # noqa: F722


@SETTINGS
@given(structs(Pair, sizes=(1, 2, 3)))
def test_sizes_agree_from_nested_to_parent(pair: Pair) -> None:
    """A size a nested struct drew first is the parent's too."""
    assert pair.a.shape == pair.inner.x.shape


@SETTINGS
@given(
    structs(
        TrainState,
        sizes={"d": "config.d_model", "layers": "config.n_layers"},
        config=st.builds(Config, d_model=st.just(2), n_layers=st.just(3)),
    )
)
def test_an_overridden_nested_struct_binds_the_sizes(state: TrainState) -> None:
    """A nested struct given by an override binds the sizes its ints hold."""
    assert state.params.blocks.shape == (3, 2, 2)


def test_a_path_through_a_non_struct_field_is_refused() -> None:
    """Binding a size inside a field that is not a struct names the field."""
    with pytest.raises(TypeError, match="inside 'key'"):
        structs(TrainState, sizes={"d": "key.d_model"})
    with pytest.raises(TypeError, match="d_modle"):
        structs(TrainState, sizes={"d": "config.d_modle"})
