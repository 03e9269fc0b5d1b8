"""explain_recompiles: each recompilation names the class, field and old/new values."""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest


class Adam(js.Struct):
    lr: float = js.field(static=True, default=0.1)


class Layer(js.Struct):
    w: object
    act: str = js.field(static=True, default="relu")


class State(js.Struct):
    params: dict
    opt: object
    layers: list = js.field(default_factory=list)
    cache: object = js.field(pytree=False, default=None)


def _watch() -> tuple[Any, list[js.Recompile]]:
    reports: list[js.Recompile] = []

    def step(state: State, scale: object = 1.0) -> Any:
        return jax.tree.map(lambda x: x * 2, state.params)

    return js.explain_recompiles(jax.jit(step), on_recompile=reports.append), reports


def _state(w: Any = None, lr: float = 0.1, **kw: Any) -> State:
    return State({"w": jnp.ones(2) if w is None else w}, Adam(lr), **kw)


def _lines(reports: list[js.Recompile]) -> list[str]:
    return [str(c) for r in reports for c in r.changes]


def test_first_compilation_is_not_reported() -> None:
    """The first call compiles without a report; repeating it reports nothing."""
    step, reports = _watch()
    step(_state())
    step(_state())
    assert reports == []


def test_static_field_change_names_class_field_and_values() -> None:
    """A changed static field is reported with its path, class, field and values."""
    step, reports = _watch()
    step(_state())
    step(_state(lr=0.01))
    assert len(reports) == 1
    assert reports[0].function.endswith("step")
    assert reports[0].count == 2
    (change,) = reports[0].changes
    assert (change.path, change.kind, change.owner, change.field) == (
        "state.opt.lr",
        "static",
        "Adam",
        "lr",
    )
    assert (change.old, change.new) == ("0.1", "0.01")
    assert str(change) == "state.opt.lr: static field Adam.lr changed 0.1 -> 0.01"


def test_shape_change_names_leaf_path() -> None:
    """A changed array shape is reported at its leaf path with old and new dtype[shape]."""
    step, reports = _watch()
    step(_state())
    step(_state(jnp.ones(3)))
    assert _lines(reports) == ["state.params['w'] (in State.params): float32[2] -> float32[3]"]


def test_array_field_shape_change_names_the_field() -> None:
    """An array held directly by a field is reported as that node field."""
    step = js.explain_recompiles(jax.jit(lambda layer: layer.w), on_recompile=lambda r: None)
    step(Layer(jnp.ones(2)))
    step(Layer(jnp.ones(5)))
    assert [str(c) for r in step.recompiles for c in r.changes] == [
        "layer.w: node field Layer.w changed float32[2] -> float32[5]"
    ]


def test_dtype_change_is_reported() -> None:
    """A changed dtype is reported at its leaf path."""
    step, reports = _watch()
    step(_state())
    step(_state(jnp.ones(2, jnp.int32)))
    assert _lines(reports) == ["state.params['w'] (in State.params): float32[2] -> int32[2]"]


def test_weak_type_change_is_reported() -> None:
    """Passing a weakly typed scalar where a strong one was is reported as such."""
    step, reports = _watch()
    step(_state(), jnp.float32(2.0))
    step(_state(), 2.0)
    assert _lines(reports) == ["scale: float32[] -> float32[] (weakly typed)"]


def test_opaque_identity_change_is_reported() -> None:
    """An opaque field holding another object is reported (opaque compares by identity)."""
    step, reports = _watch()
    step(_state(cache={}))
    step(_state(cache={}))
    (change,) = reports[0].changes
    assert (change.path, change.kind, change.owner, change.field) == (
        "state.cache",
        "opaque",
        "State",
        "cache",
    )
    assert "compared by identity" in str(change)


def test_dict_keys_change_is_a_structure_change() -> None:
    """New dict keys are reported as a structure change with both key lists."""
    step, reports = _watch()
    step(_state())
    step(State({"w": jnp.ones(2), "b": jnp.ones(2)}, Adam()))
    assert _lines(reports) == ["state.params: structure changed keys ['w'] -> keys ['w', 'b']"]


def test_list_length_change_is_a_structure_change() -> None:
    """A longer list field is reported with both lengths."""
    step, reports = _watch()
    step(_state(layers=[Layer(jnp.ones(1))]))
    step(_state(layers=[Layer(jnp.ones(1)), Layer(jnp.ones(1))]))
    assert _lines(reports) == [
        "state.layers: structure changed list of length 1 -> list of length 2"
    ]


def test_nested_static_field_in_list_has_indexed_path() -> None:
    """A static field of a struct inside a list is reported at its indexed path."""
    step, reports = _watch()
    step(_state(layers=[Layer(jnp.ones(1)), Layer(jnp.ones(1))]))
    step(_state(layers=[Layer(jnp.ones(1)), Layer(jnp.ones(1), act="tanh")]))
    assert _lines(reports) == [
        "state.layers[1].act: static field Layer.act changed 'relu' -> 'tanh'"
    ]


def test_type_change_is_reported() -> None:
    """A field holding another type is reported with both type names."""
    step, reports = _watch()
    step(_state())
    step(State({"w": jnp.ones(2)}, None))
    assert _lines(reports) == ["state.opt: type changed Adam -> None"]


def test_several_changes_are_all_reported() -> None:
    """Changes in several fields at once are each reported."""
    step, reports = _watch()
    step(_state())
    step(_state(jnp.ones(3), lr=0.5))
    assert sorted(c.kind for c in reports[0].changes) == ["leaf", "static"]


def test_diff_is_against_the_closest_earlier_compilation() -> None:
    """Only what differs from the most similar earlier compilation is reported."""
    step, reports = _watch()
    step(_state(lr=0.1))
    step(_state(lr=0.01))
    step(_state(jnp.ones(3), lr=0.01))
    assert _lines(reports)[-1] == "state.params['w'] (in State.params): float32[2] -> float32[3]"


def test_numpy_argument_of_same_shape_is_not_a_recompile() -> None:
    """A NumPy array where a JAX array of the same shape was does not report."""
    step, reports = _watch()
    step(_state())
    step(_state(np.ones(2, np.float32)))
    assert reports == []


def test_cleared_caches_report_cause_outside_arguments() -> None:
    """After jax.clear_caches() the recompile says nothing in the arguments changed."""
    step, reports = _watch()
    step(_state())
    jax.clear_caches()
    step(_state())
    assert [c.kind for c in reports[0].changes] == ["none"]
    assert "outside" in str(reports[0])


def test_explicit_keyword_argument_compares_with_its_default() -> None:
    """Passing an argument that was left to its default reports that argument."""
    step, reports = _watch()
    step(_state())
    step(_state(), scale=jnp.ones(3))
    assert _lines(reports) == ["scale: float32[] (weakly typed) -> float32[3]"]


def test_static_argnums_value_change_is_reported_as_value() -> None:
    """A changed plain value (a static argument) is reported when nothing else changed."""
    reports: list[js.Recompile] = []
    f = js.explain_recompiles(
        jax.jit(lambda x, n: x * n, static_argnums=1), on_recompile=reports.append
    )
    f(jnp.ones(2), 2)
    f(jnp.ones(2), 3)
    (change,) = reports[0].changes
    assert (change.path, change.kind, change.old, change.new) == ("n", "value", "2", "3")


def test_plain_values_are_left_out_when_a_struct_change_explains() -> None:
    """A changed non-static Python scalar is not listed when a static field explains it."""
    reports: list[js.Recompile] = []
    f = js.explain_recompiles(jax.jit(lambda s, x: x * s.opt.lr), on_recompile=reports.append)
    f(_state(), 1.0)
    f(_state(lr=0.5), 2.0)
    assert _lines(reports) == ["s.opt.lr: static field Adam.lr changed 0.1 -> 0.5"]


def test_namedtuple_leaf_path_uses_attribute_keys() -> None:
    """Inside another pytree node, the leaf path uses JAX's key path."""

    class Pair(NamedTuple):
        a: Any
        b: Any

    reports: list[js.Recompile] = []
    f = js.explain_recompiles(jax.jit(lambda p: p.a), on_recompile=reports.append)
    f(Pair(jnp.ones(1), jnp.ones(1)))
    f(Pair(jnp.ones(2), jnp.ones(1)))
    assert _lines(reports) == ["p.a: float32[1] -> float32[2]"]


def test_reports_go_to_logging_by_default(caplog: pytest.LogCaptureFixture) -> None:
    """Without a callback, a recompile is a WARNING on the 'jaxstruct.recompile' logger."""
    step = js.explain_recompiles(jax.jit(lambda s: s.params))
    with caplog.at_level(logging.WARNING, logger="jaxstruct.recompile"):
        step(_state())
        assert caplog.records == []
        step(_state(lr=0.2))
    (record,) = caplog.records
    assert record.name == "jaxstruct.recompile"
    assert record.getMessage() == (
        "<lambda> compiled again (compilation #2):\n"
        "  s.opt.lr: static field Adam.lr changed 0.1 -> 0.2"
    )


def test_decorator_form_with_options() -> None:
    """explain_recompiles(on_recompile=...) decorates a jitted function."""
    reports: list[js.Recompile] = []

    @js.explain_recompiles(on_recompile=reports.append)
    @jax.jit
    def f(s: State) -> Any:
        return s.params

    f(_state())
    f(_state(lr=0.3))
    assert len(reports) == 1


def test_wrapper_returns_results_and_forwards_lower() -> None:
    """The wrapper returns fn's result, keeps its name and forwards .lower()."""
    step, _ = _watch()
    out = step(_state())
    assert jnp.array_equal(out["w"], jnp.full(2, 2.0))
    assert step.__name__ == "step"
    assert "stablehlo" in step.lower(_state()).as_text()


def test_recompiles_attribute_keeps_reports() -> None:
    """The wrapper's recompiles attribute holds the reports, also when logging."""
    step = js.explain_recompiles(jax.jit(lambda s: s.params), on_recompile=lambda r: None)
    step(_state())
    step(_state(lr=0.7))
    assert [str(r.changes[0]) for r in step.recompiles] == [
        "s.opt.lr: static field Adam.lr changed 0.1 -> 0.7"
    ]


def test_plain_function_calling_jit_is_watched_through_tracing() -> None:
    """A non-jitted function is judged by the tracing its jitted callees do."""
    inner = jax.jit(lambda s: s.params)
    reports: list[js.Recompile] = []
    outer = js.explain_recompiles(lambda s: inner(s), on_recompile=reports.append)
    outer(_state())
    outer(_state())
    outer(_state(lr=0.9))
    assert _lines(reports) == ["s.opt.lr: static field Adam.lr changed 0.1 -> 0.9"]


def test_non_callable_is_a_clear_type_error() -> None:
    """Passing something that is not a function raises TypeError naming the fix."""
    with pytest.raises(TypeError, match=r"explain_recompiles\(jax.jit\(f\)\)"):
        js.explain_recompiles(3)  # type: ignore[call-overload]
