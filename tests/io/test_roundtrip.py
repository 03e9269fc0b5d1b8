"""load(export(x)) == x for every supported type, in all three forms."""

from __future__ import annotations

import collections
import enum
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import ml_dtypes
import numpy as np
import pytest
from jaxstruct.registry import SerializationError, register_attrs_type, register_pytree_type


class Color(enum.Enum):
    RED = "r"
    BLUE = "b"


class Level(enum.IntEnum):
    LOW = 1


Point = collections.namedtuple("Point", ["x", "y"])


class Inner(js.Struct):
    w: Any
    tag: str = js.field(static=True, default="inner")


class Outer(js.Struct):
    params: Any
    inner: Inner
    step: int = js.field(static=True, default=0)


class WeakState(js.Struct):
    lr: Any
    w: Any


class Policy(js.Struct):
    params: Any
    cache: Any = js.field(pytree=False, default="runtime")
    saved: Any = js.field(pytree=False, serialize=True, default=None)
    debug: str = js.field(static=True, serialize=False, default="dbg")
    double: int = js.field(static=True, derived=lambda s: s.count * 2, init=False)
    count: int = js.field(static=True, default=1)


class Node:
    def __init__(self, data: Any, tag: str) -> None:
        self.data, self.tag = data, tag


register_pytree_type(
    Node,
    flatten=lambda n: ([n.data], n.tag),
    unflatten=lambda aux, ch: Node(ch[0], aux),
    serializer=lambda n: {"tag": n.tag},
    deserializer=lambda payload, ch: Node(ch[0], payload["tag"]),
)


class RawAux:
    def __init__(self, data: Any, meta: tuple[int, str]) -> None:
        self.data, self.meta = data, meta


register_pytree_type(
    RawAux, flatten=lambda n: ([n.data], n.meta), unflatten=lambda aux, ch: RawAux(ch[0], aux)
)


class Edge:
    def __init__(self, flux: Any, source: int, target: int) -> None:
        self.flux, self.source, self.target = flux, source, target


register_attrs_type(Edge, node_fields=("flux",), static_fields=("source", "target"))

PLAIN = {
    "none": None,
    "bools": [True, False],
    "ints": [0, -1, 2**53, -(2**53) - 1, 7**400, -(10**5000)],
    "floats": [0.0, -0.0, 1e-310, 1.5, float("inf"), float("-inf"), float("nan")],
    "complex": [complex(1.5, -0.0), complex(float("nan"), float("inf"))],
    "str": ["", "ünïcödé 🎉", "\x00", "\ud800 lone surrogate", '{"$": "not a tag"}'],
    "bytes": [b"", bytes(range(256))],
    "paths": [
        pathlib.PurePosixPath("/a/b"),
        pathlib.Path("rel/x"),
        pathlib.PureWindowsPath("C:\\x"),
    ],
    "enums": [Color.RED, Level.LOW],
    "namedtuple": Point(1, Point(2.5, None)),
    "containers": [(), [], {}, set(), frozenset(), (1,), {1: "a", (2, 3): "b", None: 0, 1.5: 1}],
    "sets": [{1, "a", (2, 3)}, frozenset({b"x"})],
}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_values_round_trip(name: str, roundtrip, same) -> None:
    """Plain Python values come back with the same types and bits."""
    same(PLAIN[name], roundtrip(PLAIN[name]))


NUMPY_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    np.longdouble,
    "M8[ns]",
    "m8[s]",
    "U5",
    "S3",
    "V4",
]
ML_DTYPES = [
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "int4",
    "uint4",
    "int2",
    "uint2",
]


def _random_array(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    if dtype.kind in "SUVmM" or dtype.type.__module__.startswith("ml_dtypes"):
        raw = np.random.default_rng(0).integers(0, 16, n, dtype=np.uint8)
    if dtype.kind == "U":
        raw = np.frombuffer(np.full(n // 4, ord("z"), dtype="<u4").tobytes(), np.uint8)
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES + ML_DTYPES, ids=str)
def test_numpy_arrays_of_every_dtype_are_bit_exact(dtype: Any, roundtrip, same) -> None:
    """NumPy arrays of every dtype (ml_dtypes ones included) keep dtype, shape and bits."""
    dt = np.dtype(
        getattr(ml_dtypes, dtype) if isinstance(dtype, str) and hasattr(ml_dtypes, dtype) else dtype
    )
    arr = _random_array(dt, (3, 4))
    same(arr, roundtrip(arr))


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.array(3.5, dtype=np.float32),
        lambda: np.zeros((0, 3), dtype=np.int16),
        lambda: np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        lambda: np.arange(24, dtype=np.int32).reshape(4, 6)[::2, 1::2],
        lambda: np.arange(6, dtype=">f8").reshape(2, 3),
        lambda: np.arange(6, dtype=">c16"),
    ],
    ids=["0d", "empty", "fortran", "noncontiguous", "bigendian", "bigendian-complex"],
)
def test_array_layouts_round_trip(make, roundtrip, same) -> None:
    """0-d, empty, Fortran-order, non-contiguous and big-endian arrays round-trip exactly."""
    arr = make()
    out = roundtrip(arr)
    same(arr, out)
    if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous:
        assert out.flags.f_contiguous


def test_numpy_scalars_keep_their_type(roundtrip, same) -> None:
    """NumPy scalars come back as the same scalar type with the same bits."""
    values = [
        np.float32(1.5),
        np.int64(-3),
        np.bool_(True),
        np.complex64(1j),
        np.float16(np.nan),
        ml_dtypes.bfloat16(2.5),
        np.datetime64("2024-01-01", "D"),
        np.str_("hé"),
    ]
    same(values, roundtrip(values))


@pytest.mark.parametrize(
    "dtype",
    [
        "float32",
        "bfloat16",
        "float16",
        "int8",
        "bool",
        "complex64",
        "int4",
        "float8_e4m3fn",
        "uint32",
    ],
)
def test_jax_arrays_round_trip_as_jax_arrays(dtype: str, roundtrip, same) -> None:
    """JAX arrays of 32-bit-or-narrower dtypes come back as JAX arrays with the same bits."""
    arr = jnp.asarray(_random_array(np.dtype(getattr(ml_dtypes, dtype, None) or dtype), (2, 5)))
    out = roundtrip(arr)
    assert isinstance(out, jax.Array)
    same(arr, out)


def test_weakly_typed_jax_arrays_stay_weak(roundtrip, same) -> None:
    """Weakly typed JAX arrays (a learning rate from a Python float) come back weakly typed."""
    values = {
        "lr": jnp.asarray(0.1),
        "count": jnp.asarray(3),
        "grid": jax.lax.full((2, 3), 0.5),
        "strong": jnp.asarray(0.1, dtype=jnp.float32),
    }
    assert [v.weak_type for v in values.values()] == [True, True, True, False]
    out = roundtrip(values)
    assert [v.weak_type for v in out.values()] == [True, True, True, False]
    same(values, out)


def test_loaded_state_hits_the_jit_cache(tmp_path) -> None:
    """A checkpoint loaded back does not make a jitted step compile again."""
    traces: list[int] = []

    @jax.jit
    def step(s: WeakState) -> WeakState:
        traces.append(1)
        return s.replace(w=s.w - s.lr)

    state = step(WeakState(lr=jnp.asarray(0.1), w=jnp.ones(2)))
    for path in (tmp_path / "ckpt", tmp_path / "ckpt.zip"):
        step(WeakState.load(state.export(path)))
    step(WeakState.from_state_dict(state.to_state_dict()))
    assert len(traces) == 1


def test_64bit_jax_array_is_never_narrowed(roundtrip) -> None:
    """With x64 off, a stored 64-bit JAX array is a clear error, never a truncated array."""
    payload = jio.to_state_dict(np.arange(3, dtype=np.int64))
    payload["manifest"]["nodes"][0][0] = "jaxarray"
    with pytest.raises(SerializationError, match="jax_enable_x64"):
        jio.from_state_dict(payload)


def test_nested_structs_round_trip(roundtrip, same) -> None:
    """Nested Structs with array, dict and static fields round-trip, class and all."""
    s = Outer(
        params={"w": jnp.ones(3), "b": np.zeros(2)}, inner=Inner(np.arange(4), tag="t"), step=9
    )
    out = roundtrip(s)
    assert type(out) is Outer
    same(s, out)


def test_field_policy_is_applied(roundtrip) -> None:
    """Derived fields are recomputed; opaque fields need serialize=True; serialize=False skips."""
    s = Policy(params=1, cache="live", saved=[1, 2], debug="custom", count=4)
    out = roundtrip(s)
    assert (out.cache, out.saved, out.debug, out.double) == ("runtime", [1, 2], "dbg", 8)


def test_field_policy_shapes_the_manifest() -> None:
    """Only serialised fields appear in the stored struct node."""
    node = jio.to_state_dict(Policy(params=1))["manifest"]["nodes"][-1]
    assert sorted(node[3]) == ["count", "params", "saved"]


def test_registered_pytree_with_serializer_round_trips(roundtrip, same) -> None:
    """register_pytree_type's serializer/deserializer pair is used to store and rebuild."""
    value = Node(np.arange(3), "tagged")
    out = roundtrip(value)
    assert type(out) is Node and out.tag == "tagged"
    same(value, out)


def test_registered_pytree_without_serializer_stores_aux(roundtrip, same) -> None:
    """Without a serializer, the aux data itself is stored (when it is representable)."""
    value = RawAux(jnp.ones(2), (3, "m"))
    same(value, roundtrip(value))


def test_attrs_type_round_trips(roundtrip, same) -> None:
    """register_attrs_type classes round-trip with their static attributes."""
    value = Edge(np.float32(1.5), source=0, target=3)
    same(value, roundtrip(value))


def test_ten_thousand_levels_round_trip(roundtrip, same) -> None:
    """A value nested 10,000 levels deep round-trips without recursion."""
    value: Any = "leaf"
    for i in range(10_000):
        value = [value] if i % 2 else {"k": value}
    same(value, roundtrip(value))


def test_unsupported_value_is_refused_with_its_path(form, tmp_path) -> None:
    """An unrepresentable value is a SerializationError naming its path, and nothing is written."""
    value = {"ok": 1, "bad": [1, object()]}
    with pytest.raises(SerializationError, match=r"root\['bad'\]\[1\]"):
        if form == "state":
            jio.to_state_dict(value)
        else:
            jio.export(value, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "value",
    [
        np.array([object()]),
        np.zeros(2, dtype=[("a", "<i4")]),
        np.ma.masked_array([1, 2], mask=[0, 1]),
        type("MyInt", (int,), {})(3),
    ],
    ids=["object-array", "structured", "masked", "int-subclass"],
)
def test_values_that_would_change_type_are_refused(value: Any) -> None:
    """Object arrays, structured dtypes and subclasses of supported types are refused."""
    with pytest.raises(SerializationError):
        jio.to_state_dict({"v": value})


def test_reference_cycle_is_refused() -> None:
    """A container that contains itself is a SerializationError, not a hang."""
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(SerializationError, match="cycle"):
        jio.to_state_dict(loop)


def test_tracer_is_refused() -> None:
    """Exporting inside jit is refused with a clear message."""

    def f(x: Any) -> Any:
        jio.to_state_dict(x)
        return x

    with pytest.raises(SerializationError, match="tracer"):
        jax.jit(f)(jnp.ones(2))


def test_struct_load_returns_the_class_or_raises(tmp_path) -> None:
    """T.load returns a T; loading something else through T raises SerializationError."""
    Outer(params=1, inner=Inner(2)).export(tmp_path / "o")
    assert type(Outer.load(tmp_path / "o")) is Outer
    jio.export([1, 2], tmp_path / "l")
    with pytest.raises(SerializationError):
        Outer.load(tmp_path / "l")


def test_state_dict_holds_numpy_arrays_without_copying() -> None:
    """to_state_dict keeps the caller's NumPy arrays; from_state_dict returns them uncopied."""
    arr = np.arange(10.0)
    payload = jio.to_state_dict({"a": arr})
    assert payload["array_data"]["a0"] is arr
    assert jio.from_state_dict(payload)["a"] is arr


def test_load_cls_resolves_a_renamed_class(tmp_path) -> None:
    """load_cls supplies the root class when the stored reference is not known here."""
    payload = jio.to_state_dict(Inner(np.ones(1)))
    payload["manifest"]["nodes"][-1][1] = "somewhere.else:OldName"
    with pytest.raises(SerializationError, match=r"somewhere\.else:OldName"):
        jio.from_state_dict(payload)
    assert type(jio.from_state_dict(payload, load_cls=Inner)) is Inner
    assert type(jio.from_state_dict(payload, load_cls={"somewhere.else:OldName": Inner})) is Inner


class _Perm(enum.Flag):
    R = 1
    W = 2
    X = 4


class _Bits(enum.IntFlag, boundary=enum.KEEP):
    A = 1
    B = 2


@pytest.mark.parametrize(
    "value",
    [_Perm.R, _Perm.R | _Perm.W, _Perm.R | _Perm.W | _Perm.X, _Perm(0), _Bits.A | _Bits.B],
)
def test_flag_combinations_round_trip(tmp_path: pathlib.Path, value: enum.Flag) -> None:
    """A combination of flags (or none of them) loads back as the same value."""
    out = jio.load(jio.export({"perm": value}, tmp_path / "ck.zip"))["perm"]
    assert out == value and type(out) is type(value)
    assert jio.from_state_dict(jio.to_state_dict([value])) == [value]


def test_a_flag_with_unnamed_bits_is_refused_at_export(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SerializationError, match=r"holds bits no member of _Bits names"):
        jio.export({"bits": _Bits(8 | 1)}, tmp_path / "ck")
    assert not (tmp_path / "ck").exists()
