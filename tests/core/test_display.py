"""Array summaries, pformat line breaking, and the IPython/rich/treescope displays."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest


class Linear(js.Struct):
    w: object
    b: object
    act: str = js.field(static=True, default="relu")


class MLP(js.Struct):
    layers: list
    token: str = js.field(static=True, repr=False, default="secret")
    cache: object = js.field(pytree=False, default=None)


def _mlp(n: int) -> MLP:
    return MLP([Linear(jnp.ones((4, 4)), np.zeros(4)) for _ in range(n)])


@pytest.fixture
def summaries() -> Iterator[None]:
    """Every array shown as dtype and shape: the layout tests' arrays are small."""
    with js.printoptions(threshold=0):
        yield


# -- summaries ---------------------------------------------------------------------------


def test_shape_dtype_struct_summary() -> None:
    """A jax.ShapeDtypeStruct shows as ShapeDtypeStruct<dtype[shape]>."""
    spec = jax.ShapeDtypeStruct((2, 3), jnp.int32)
    assert js.pformat(spec) == "ShapeDtypeStruct<int32[2,3]>"


def test_eval_shape_struct_shows_abstract_leaves() -> None:
    """jax.eval_shape of a struct gives ShapeDtypeStruct leaves in its text form."""
    out = jax.eval_shape(lambda: Linear(jnp.ones(3), jnp.zeros(2)))
    assert js.pformat(out, width=100) == (
        "Linear(w=ShapeDtypeStruct<float32[3]>, b=ShapeDtypeStruct<float32[2]>, act='relu')"
    )


def test_vmap_tracer_summary_shows_per_example_shape() -> None:
    """Under vmap a field shows as Traced<...> with the unbatched shape."""
    seen: list[str] = []

    def f(w: jax.Array) -> jax.Array:
        seen.append(repr(Linear(w, None)))
        return w

    jax.vmap(f)(jnp.ones((5, 2)))
    assert seen == ["Linear(w=Traced<float32[2]>, b=None, act='relu')"]


def test_key_array_summary_uses_key_dtype_name() -> None:
    """A typed PRNG key array shows its key dtype."""
    assert js.pformat(jax.random.key(0)) == "key<fry>[]"


def test_numpy_scalar_is_not_summarised() -> None:
    """NumPy scalars keep their own repr (they are values, not arrays)."""
    assert js.pformat(np.float32(1.5)) == repr(np.float32(1.5))


class AdamState(NamedTuple):
    count: Any
    mu: Any


# -- pformat ---------------------------------------------------------------------------


@pytest.mark.usefixtures("summaries")
def test_pformat_keeps_one_line_when_it_fits() -> None:
    """A value that fits the width stays on one line, identical to repr."""
    layer = Linear(jnp.ones(2), 1.0)
    assert js.pformat(layer, width=80) == repr(layer) == "Linear(w=float32[2], b=1.0, act='relu')"


@pytest.mark.usefixtures("summaries")
def test_pformat_breaks_with_indentation_and_trailing_commas() -> None:
    """A value too wide for the width gets one item per line, indented, with commas."""
    assert js.pformat(Linear(jnp.ones(2), 1.0), width=20) == (
        "Linear(\n    w=float32[2],\n    b=1.0,\n    act='relu',\n)"
    )


@pytest.mark.usefixtures("summaries")
def test_pformat_breaks_only_the_groups_that_do_not_fit() -> None:
    """Inner groups that fit stay on one line inside a broken outer group."""
    text = js.pformat(_mlp(2), width=60)
    assert text == (
        "MLP(\n"
        "    layers=[\n"
        "        Linear(w=float32[4,4], b=np.float64[4], act='relu'),\n"
        "        Linear(w=float32[4,4], b=np.float64[4], act='relu'),\n"
        "    ],\n"
        "    cache=None,\n"
        ")"
    )


@pytest.mark.usefixtures("summaries")
def test_pformat_lines_fit_the_width() -> None:
    """No line exceeds the width when every atom is narrower than it."""
    for width in (30, 45, 60, 100):
        assert max(len(line) for line in js.pformat(_mlp(3), width=width).split("\n")) <= width


def test_pformat_counts_the_trailing_comma() -> None:
    """A child that fits only without its trailing comma is broken."""
    inner = Linear(1, 2)
    flat = repr(inner)  # Linear(w=1, b=2, act='relu')
    width = 4 + len(flat)  # "    " + flat, but no room for the ","
    assert js.pformat([inner, inner], width=width).split("\n")[1] == "    Linear("
    assert js.pformat([inner, inner], width=width + 1).split("\n")[1] == "    " + flat + ","


@pytest.mark.usefixtures("summaries")
def test_pformat_dicts_and_tuples() -> None:
    """Dicts break as key: value lines; a one-element tuple keeps its comma when flat."""
    assert js.pformat({"a": (jnp.ones(3),)}) == "{'a': (float32[3],)}"
    assert js.pformat({"a": 1, "bb": [1, 2]}, width=10) == (
        "{\n    'a': 1,\n    'bb': [\n        1,\n        2,\n    ],\n}"
    )


@pytest.mark.usefixtures("summaries")
def test_pformat_named_tuple_fields_and_summaries() -> None:
    """A named tuple (an optimizer state) prints by field, arrays summarised, and breaks."""
    state = AdamState(jnp.zeros((), jnp.int32), {"w": jnp.ones(3)})
    assert js.pformat(state) == "AdamState(count=int32[], mu={'w': float32[3]})"
    assert js.pformat(state, width=28) == (
        "AdamState(\n    count=int32[],\n    mu={'w': float32[3]},\n)"
    )


def test_pformat_keeps_named_tuple_custom_repr() -> None:
    """A named tuple class with its own __repr__ is printed with it."""

    class Point(NamedTuple):
        x: int

        def __repr__(self) -> str:
            return "<point>"

    assert js.pformat([Point(1)]) == "[<point>]"


def test_pformat_custom_indent() -> None:
    """indent= sets the columns per nesting level."""
    assert js.pformat([1, 2], width=3, indent=2) == "[\n  1,\n  2,\n]"


def test_pformat_hides_repr_false_fields() -> None:
    """Fields declared repr=False are left out of pformat, as of repr."""
    assert "secret" not in js.pformat(_mlp(1), width=20)
    assert "token" not in repr(_mlp(1))


def test_pformat_rejects_bad_width() -> None:
    """A non-positive width is a clear ValueError naming the argument."""
    with pytest.raises(ValueError, match="width must be a positive"):
        js.pformat(1, width=0)


def test_pformat_rejects_negative_indent() -> None:
    """A negative indent is a clear ValueError naming the argument."""
    with pytest.raises(ValueError, match="indent must be 0 or more"):
        js.pformat(1, indent=-1)


def test_pformat_self_containing_list_does_not_loop() -> None:
    """A list containing itself prints [...] where it recurs."""
    items: list = [1]
    items.append(items)
    assert js.pformat(items) == "[1, [...]]"


def test_pformat_uses_a_user_written_repr() -> None:
    """A struct subclass with its own __repr__ is printed with it, as one atom."""

    class Custom(js.Struct):
        x: int

        def __repr__(self) -> str:
            return "<custom>"

    assert js.pformat([Custom(1)]) == "[<custom>]"


# -- repr ------------------------------------------------------------------------------


@pytest.mark.usefixtures("summaries")
def test_long_repr_breaks_lines() -> None:
    """A repr wider than 80 columns uses the multi-line pformat form."""
    text = repr(_mlp(5))
    assert text == js.pformat(_mlp(5), width=80)
    assert text.count("\n") == 9
    assert max(len(line) for line in text.split("\n")) <= 80


@pytest.mark.usefixtures("summaries")
def test_repr_of_short_struct_is_one_line() -> None:
    """A repr that fits in 80 columns has no line break."""
    assert "\n" not in repr(_mlp(1))


# -- IPython ---------------------------------------------------------------------------


def test_ipython_pretty_gives_multiline_form() -> None:
    """IPython's pretty() shows the pformat layout at its width."""
    from IPython.lib.pretty import pretty

    assert pretty(_mlp(3), max_width=60) == js.pformat(_mlp(3), width=60)


def test_ipython_pretty_indents_nested_struct_lines() -> None:
    """Inside an IPython-printed list, the struct's later lines follow the list's indent."""
    from IPython.lib.pretty import pretty

    lines = pretty([_mlp(3)], max_width=60).split("\n")
    assert lines[0] == "[MLP("
    assert lines[1] == "     layers=["
    assert lines[-1] == " )]"


def test_ipython_pretty_of_cycle() -> None:
    """A struct reached again through itself prints as Name(...) in IPython."""
    from IPython.lib.pretty import pretty

    items: list = []
    outer = MLP(items)
    items.append(outer)
    assert "MLP(...)" in pretty(outer)


def test_ipython_respects_user_written_repr() -> None:
    """IPython shows a subclass's own __repr__ rather than the struct layout."""
    from IPython.lib.pretty import pretty

    class Custom(js.Struct):
        x: int

        def __repr__(self) -> str:
            return "<custom>"

    assert pretty(Custom(1)) == "<custom>"


# -- rich ------------------------------------------------------------------------------


def test_rich_pretty_repr_one_line_with_summaries() -> None:
    """rich shows fields by name and arrays as summaries, nested in containers too."""
    from rich.pretty import pretty_repr

    layer = Linear(jnp.ones(2), {"k": [np.zeros(3)]})
    assert pretty_repr(layer) == "Linear(w=float32[2], b={'k': [np.float64[3]]}, act='relu')"


def test_rich_summarises_arrays_in_named_tuples() -> None:
    """rich shows arrays inside a named tuple field as summaries."""
    from rich.pretty import pretty_repr

    layer = Linear(AdamState(jnp.zeros(()), jnp.ones(2)), None)
    assert pretty_repr(layer) == (
        "Linear(w=AdamState(count=float32[], mu=float32[2]), b=None, act='relu')"
    )


def test_rich_pretty_repr_breaks_lines() -> None:
    """rich breaks a struct that is too wide over several lines, hiding repr=False fields."""
    from rich.pretty import pretty_repr

    text = pretty_repr(_mlp(2), max_width=40)
    assert text.split("\n")[:3] == ["MLP(", "    layers=[", "        Linear("]
    assert "w=float32[4,4]," in text
    assert "secret" not in text


def test_rich_pretty_repr_of_self_containing_list() -> None:
    """A list containing itself inside a field does not loop in rich."""
    from rich.pretty import pretty_repr

    items: list = [1]
    items.append(items)
    assert pretty_repr(Linear(items, None)) == "Linear(w=[1, [...]], b=None, act='relu')"


# -- treescope -------------------------------------------------------------------------


def test_treescope_renders_fields_with_kinds() -> None:
    """treescope shows each field on its line, static and opaque ones marked."""
    import treescope

    lines = treescope.render_to_text(MLP([Linear(jnp.ones(2), 1.0)], cache={})).split("\n")
    assert lines[3].startswith("      w=<jax.Array")  # treescope's own array rendering
    assert lines[:3] + lines[4:] == [
        "MLP(",
        "  layers=[",
        "    Linear(",
        "      b=1.0,",
        "      act='relu',  # static",
        "    ),",
        "  ],",
        "  cache={},  # opaque",
        ")",
    ]


def test_treescope_shows_repr_false_fields_only_in_roundtrip_mode() -> None:
    """A repr=False field is hidden normally and shown in round-trip mode."""
    import treescope

    assert "token" not in treescope.render_to_text(_mlp(1))
    assert "token='secret',  # static" in treescope.render_to_text(_mlp(1), roundtrip_mode=True)


def test_treescope_html_is_foldable_and_names_fields() -> None:
    """The HTML render names the fields and their kinds, in foldable nodes."""
    import treescope

    html = treescope.render_to_html(_mlp(1), compressed=False)
    for needle in ("MLP", "Linear", "layers=", "act=", "# static", "# opaque"):
        assert needle in html
    assert "foldable" in html


def test_treescope_replaces_generic_pytree_box() -> None:
    """treescope no longer falls back to its generic pytree-children rendering."""
    import treescope

    assert "PyTree" not in treescope.render_to_text(_mlp(1))


# -- import cost -----------------------------------------------------------------------


def test_importing_core_does_not_import_display_libraries() -> None:
    """import jaxstruct.core loads none of rich, treescope or IPython."""
    code = (
        "import sys, jaxstruct.core as js; "
        "repr(js.Struct); "
        "print(sorted(m for m in ('rich', 'treescope', 'IPython') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_pretty_printing_a_struct_class_shows_the_class() -> None:
    """Pretty printers that call _repr_pretty_ on a class object get the class repr."""
    import io

    import hypothesis
    from hypothesis.vendor.pretty import pretty as hypothesis_pretty
    from IPython.lib.pretty import RepresentationPrinter, pretty

    out = io.StringIO()
    printer = RepresentationPrinter(out)
    Linear._repr_pretty_(printer, False)  # as such a printer calls it
    printer.flush()
    assert out.getvalue() == repr(Linear)
    qualified = f"{Linear.__module__}.{Linear.__qualname__}"
    # Hypothesis calls the class object's own _repr_pretty_ from 6.115.6 on; before,
    # it printed classes with its own type printer, as IPython still does.
    hypothesis_calls_it = hypothesis.__version_info__ >= (6, 115, 6)
    assert hypothesis_pretty(Linear) == (repr(Linear) if hypothesis_calls_it else qualified)
    assert pretty(Linear) == qualified  # IPython's own
