"""flax.struct, flax.serialization and equinox spellings on structs, against the installed peers.

Issue 28 (items 1, 2 and 4): ``flax.struct.field``/``equinox.field`` in a struct
body, ``@flax.struct.dataclass`` on a struct subclass, and struct classes in
flax's serialization registry (registered lazily, as with optree).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
eqx = pytest.importorskip("equinox")
import jaxstruct.core as js  # noqa: E402
from flax import serialization, struct  # noqa: E402


class Inner(js.Struct):
    w: Any
    name: str = struct.field(pytree_node=False, default="inner")


class Outer(js.Struct):
    inner: Inner
    table: Any
    steps: int = eqx.field(static=True, default=3)
    scale: Any = eqx.field(default=1, converter=jnp.asarray)
    cache: Any = js.field(pytree=False, default=None)


def _outer() -> Outer:
    return Outer(inner=Inner(w=jnp.arange(3.0)), table={"a": jnp.ones(2), "b": [jnp.zeros(1)]})


def test_flax_and_equinox_field_spellings_are_honoured() -> None:
    assert Inner.static_fields() == ("name",)
    assert Outer.static_fields() == ("steps",) and Outer.opaque_fields() == ("cache",)
    assert isinstance(_outer().scale, jax.Array)  # equinox's converter ran


def test_flax_struct_dataclass_on_a_struct_subclass_keeps_it_a_struct() -> None:
    @struct.dataclass
    class Custom(Inner):
        reward: float = 1.0
        name: str = struct.field(pytree_node=False, default="custom")

    custom = Custom(w=1)
    assert isinstance(custom, js.Struct) and type(Custom) is js.StructMeta
    assert (custom.reward, custom.name) == (1.0, "custom")
    assert Custom.static_fields() == ("name",)
    assert jax.tree.leaves(custom) == [1, 1.0]

    @struct.dataclass(kw_only=True)  # flax's decorator with options, too
    class Other(Inner):
        extra: int = 0

    assert Other(w=1).extra == 0


def test_to_state_dict_has_node_fields_only() -> None:
    state = serialization.to_state_dict(_outer())
    assert set(state) == {"inner", "table", "scale"}
    assert set(state["inner"]) == {"w"}
    assert set(state["table"]) == {"a", "b"} and set(state["table"]["b"]) == {"0"}


def test_to_bytes_from_bytes_round_trip_nested_in_a_dict() -> None:
    saved = {"model": _outer().replace(scale=jnp.asarray(5.0)), "step": 7}
    raw = serialization.to_bytes(saved)
    cache = object()
    target = {"model": _outer().replace(cache=cache), "step": 0}
    restored = serialization.from_bytes(target, raw)
    model = restored["model"]
    assert type(model) is Outer and type(model.inner) is Inner and restored["step"] == 7
    np.testing.assert_array_equal(model.inner.w, [0.0, 1.0, 2.0])
    assert float(model.scale) == 5.0
    # Static and opaque fields are not in the state dict: they come from the target.
    assert model.steps == 3 and model.inner.name == "inner" and model.cache is cache


def test_from_state_dict_of_a_batch() -> None:
    batch = jax.vmap(lambda w: Inner(w=w))(jnp.arange(12.0).reshape(4, 3))
    state = serialization.to_state_dict(batch)
    back = serialization.from_state_dict(Inner(w=jnp.zeros((4, 3))), state)
    np.testing.assert_array_equal(back.w, batch.w)


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ({"inner": {}, "table": {}}, "lacks the node field(s) ['scale']"),
        ({"inner": {}, "table": {}, "scale": 1, "bogus": 2}, "['bogus'] that are not node"),
        ([1, 2], "expected a state dict"),
    ],
)
def test_a_state_dict_for_another_class_is_a_serialization_error(state, words) -> None:
    with pytest.raises(js.SerializationError) as info:
        serialization.from_state_dict(_outer(), state)
    assert isinstance(info.value, ValueError)  # what flax.struct raises, still caught
    assert words in str(info.value) and f"{__name__}.Outer" in str(info.value)


def test_a_class_registered_with_flax_by_hand_keeps_its_functions() -> None:
    class Own(js.Struct):
        x: Any

    # Registered at definition (flax is imported): flax refuses a second
    # registration, so a user's own functions need override=True, as for any type.
    assert serialization.is_serializable(Own)
    serialization.register_serialization_state(
        Own, lambda o: {"mine": o.x}, lambda o, s: o.replace(x=s["mine"]), override=True
    )
    assert serialization.to_state_dict(Own(x=1)) == {"mine": 1}


def _run_ok(code: str) -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_registration_is_lazy_and_independent_of_import_order() -> None:
    """jaxstruct never imports flax; classes defined before flax's import are registered."""
    _run_ok(
        """
        import sys
        import jaxstruct.core as js
        class Early(js.Struct):
            x: object
            n: int = js.field(static=True, default=2)
        assert "flax" not in sys.modules and "flax.serialization" not in sys.modules
        from flax import serialization
        class Late(js.Struct):
            e: Early
        raw = serialization.to_bytes(Late(e=Early(x=3)))
        back = serialization.from_bytes(Late(e=Early(x=0, n=5)), raw)
        assert back == Late(e=Early(x=3, n=5)), back
        """
    )


def test_registration_when_flax_is_imported_first() -> None:
    _run_ok(
        """
        from flax import serialization
        import jaxstruct.core as js
        class P(js.Struct):
            x: object
        assert serialization.is_serializable(P)
        assert serialization.to_state_dict(P(x=1)) == {"x": 1}
        """
    )
