"""assert_roundtrip, assert_pytree_roundtrip and first_difference, including their messages."""

from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import numpy as np
import pytest
from jaxstruct.testing import assert_pytree_roundtrip, assert_roundtrip, first_difference


class State(js.Struct):
    params: dict
    step: int = js.field(static=True, default=0)
    cache: object = js.field(pytree=False, default=None)


def test_first_difference_none_for_equal_values():
    """Equal values (NaN included, bitwise) have no difference."""
    assert first_difference([np.array([np.nan]), 1.0], [np.array([np.nan]), 1.0]) is None


def test_first_difference_names_dtype():
    """A dtype change is reported with its path."""
    msg = first_difference({"w": np.zeros(2, np.float32)}, {"w": np.zeros(2, np.float64)})
    assert msg == "x['w']: dtype float32 != float64"


def test_first_difference_names_first_differing_bit_index():
    """A value change is reported at the first differing index."""
    msg = first_difference(np.zeros((2, 2)), np.array([[0.0, 0.0], [0.0, 1.0]]))
    assert msg is not None and msg.startswith("x: bits differ at index (1, 1)")


def test_first_difference_distinguishes_signed_zero():
    """-0.0 and 0.0 differ in bits."""
    assert first_difference(np.array(-0.0), np.array(0.0)) is not None
    assert first_difference(-0.0, 0.0) == "x: -0.0 != 0.0"


def test_first_difference_array_kind():
    """A NumPy array is not a JAX array."""
    msg = first_difference(np.zeros(1, np.float32), jnp.zeros(1))
    assert msg is not None and msg.startswith("x: type numpy.ndarray != ")


def test_first_difference_struct_fields_path():
    """Struct fields appear in the path."""
    a = State(params={"w": np.zeros(1)}, step=1)
    b = State(params={"w": np.ones(1)}, step=1)
    assert first_difference(a, b).startswith("x.params['w']: bits differ")


def test_first_difference_missing_keys():
    """Missing and unexpected dict keys are listed."""
    assert first_difference({"a": 1}, {"b": 1}) == "x: keys differ, missing ['a'], unexpected ['b']"


def test_assert_roundtrip_passes_for_struct():
    """A struct with arrays, a static field and an opaque one round-trips in all formats."""
    assert_roundtrip(State(params={"w": jnp.arange(3.0), "b": np.int8(3)}, step=2, cache=object()))


def test_assert_roundtrip_rejects_unknown_format():
    """An unknown format name is a ValueError listing the valid ones."""
    with pytest.raises(ValueError, match="unknown format"):
        assert_roundtrip(State(params={}), formats=["pickle"])


def test_assert_roundtrip_reports_first_difference(monkeypatch):
    """A lossy serialiser is reported with the format and the first differing path."""
    from jaxstruct import io

    real = io.from_state_dict

    def lossy(payload, **kwargs):
        restored = real(payload, **kwargs)
        return restored.replace(
            params={**restored.params, "w": restored.params["w"].astype(jnp.float16)}
        )

    monkeypatch.setattr(io, "from_state_dict", lossy)
    with pytest.raises(
        AssertionError, match=r"state_dict: .* at x.params\['w'\]: dtype float32 != float16"
    ):
        assert_roundtrip(State(params={"w": jnp.ones(2)}), formats=["state_dict"])


def test_assert_roundtrip_uses_given_directory(tmp_path):
    """Checkpoints are written under tmp_path when given."""
    assert_roundtrip(
        State(params={"w": np.ones(1)}), formats=["directory", "zip"], tmp_path=tmp_path
    )
    assert (tmp_path / "checkpoint").is_dir() and (tmp_path / "checkpoint.zip").is_file()


def test_assert_pytree_roundtrip_passes():
    """Arrays, Python numbers and non-array leaves survive flatten/unflatten and jit."""
    assert_pytree_roundtrip(
        State(params={"w": np.ones(2, np.float32), "n": 3, "s": "text"}, step=1)
    )


def test_assert_pytree_roundtrip_reports_broken_unflatten():
    """A pytree whose unflatten loses data is reported with the path."""

    class Lossy:
        def __init__(self, v):
            self.v = v

        def __eq__(self, other):
            return type(other) is Lossy and np.array_equal(self.v, other.v)

        __hash__ = None

    jax.tree_util.register_pytree_node(
        Lossy, lambda o: ((o.v,), None), lambda aux, ch: Lossy(np.zeros_like(ch[0]))
    )
    with pytest.raises(AssertionError, match=r"flatten/unflatten: .* at x.params\['k'\]"):
        assert_pytree_roundtrip(State(params={"k": Lossy(np.ones(1, np.float32))}))


class Counter(js.Struct):
    w: np.ndarray
    count: int = js.field(default=0, serialize=False)  # a planted bug: state not stored


def test_strict_roundtrip_checks_fields_not_serialized() -> None:
    """strict=True compares node fields declared serialize=False, and says why they differ."""
    x = Counter(w=np.ones(2), count=5)
    assert_roundtrip(x)  # the default check skips the field
    with pytest.raises(AssertionError, match=r"state_dict: .* at x\.count: 5 != 0 \(strict=True"):
        assert_roundtrip(x, strict=True)


def test_first_difference_serialized_only_skips_unstored_fields() -> None:
    """serialized_only=True skips the fields exports do not store."""
    a, b = Counter(w=np.ones(2), count=5), Counter(w=np.ones(2), count=0)
    assert first_difference(a, b) == "x.count: 5 != 0"
    assert first_difference(a, b, serialized_only=True) is None


def test_pytree_roundtrip_compiles_once_per_leaf_signature(caplog) -> None:
    """Repeated calls on same-shaped values reuse one jit compilation (not one per call)."""

    class Three(js.Struct):
        a: jax.Array
        b: jax.Array
        c: np.ndarray

    def make(i: int) -> Three:
        # A leaf signature no other test uses, so the first call compiles.
        return Three(
            a=jnp.full((7, 5, 3), i), b=jnp.zeros(11, jnp.int8), c=np.zeros(13, np.float32)
        )

    values = [make(i) for i in range(3)]
    with jax.log_compiles(), caplog.at_level("WARNING"):
        for value in values:
            assert_pytree_roundtrip(value)
    messages = [r.getMessage() for r in caplog.records]
    # The identity under jit (whatever its name): its input is the three leaves.
    compiles = [m for m in messages if "Compiling" in m and "int8[11]" in m and "32[13]" in m]
    assert len(compiles) <= 1, compiles


def _sgd(params: object) -> object:
    return params


class Resumable(js.Struct):
    """A train state as docs/scale.md writes it: tx comes from the code, never the file."""

    w: np.ndarray
    step: int = 0
    tx: Any = js.field(static=True, default=None, serialize=False)


class Holder(js.Struct):
    states: list[Resumable]


def test_strict_roundtrip_can_exclude_named_fields() -> None:
    """exclude= leaves named serialize=False fields out of strict, in nested structs too."""
    x = Resumable(w=np.ones(2), step=3, tx=_sgd)
    with pytest.raises(AssertionError, match=r"at x\.tx: .* exclude=\[its name\]"):
        assert_roundtrip(x, strict=True, formats=("state_dict",))
    assert_roundtrip(x, strict=True, exclude=["tx"], formats=("state_dict",))
    assert_roundtrip(Holder(states=[x]), strict=True, exclude="tx", formats=("state_dict",))


def test_exclude_must_name_a_field() -> None:
    """A name in exclude= that no struct inside x has is a typo: ValueError."""
    x = Resumable(w=np.ones(2), tx=_sgd)
    with pytest.raises(ValueError, match=r"\['txx'\] is not the name of a field"):
        assert_roundtrip(x, strict=True, exclude=["txx"], formats=("state_dict",))
