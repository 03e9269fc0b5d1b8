"""``CodecTests``: jaxstruct's own conformance tests for a codec plugin, in one subclass.

::

    class TestDatetime(CodecTests):
        codec = DATETIME
        examples = [datetime.datetime(2026, 12, 7, tzinfo=datetime.timezone.utc)]

Every test uses the codec for that test only (:meth:`jaxstruct.io.PluginRegistry.using`),
so an installed copy of the same plugin is replaced, not tested.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jaxstruct.core as js
import jaxstruct.io as jio

try:
    import pytest
except ModuleNotFoundError:  # pragma: no cover - every test run has it
    raise ModuleNotFoundError(
        "jaxstruct.testing.FormatTests and CodecTests are pytest test classes: install "
        "pytest (pip install pytest) in the environment that runs your plugin's tests"
    ) from None
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jaxstruct.io import Codec, PluginError
from jaxstruct.registry import StructError

__all__ = ["CodecTests"]


class Holder(js.Struct):
    """A struct holding a codec's value in a node field, and (when hashable) a static one."""

    node: Any
    static: Any = js.field(static=True, default=None)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _unequal_to_itself(value: Any) -> bool:
    """Whether ``value`` is NaN-like (``x != x``, which a codec must give back as such)."""
    return bool(value != value)  # noqa: PLR0124 - the point: NaN is unequal to itself


class CodecTests:
    """The promises of a ``jaxstruct.io`` codec, as tests: subclass it, set ``codec`` and
    ``examples``.

    Example (in a plugin's ``tests/test_codecs.py``)::

        from jaxstruct.testing import CodecTests
        from my_plugin import FRACTION

        class TestFraction(CodecTests):
            codec = FRACTION
            examples = [fractions.Fraction(1, 3), fractions.Fraction(-7, 2)]

    The tests check that the codec could be registered by a plugin, that ``examples``
    hold a value of each of its types, and that ``decode(encode(x))`` gives back a value
    equal to ``x`` of exactly its type (its ``repr`` too, so a lost ``tzinfo`` or
    ``fold`` shows), directly, through a state dict, inside a struct's fields, as a dict
    key and value, in lists, and through every built-in format; with ``strategy`` set,
    the same holds for the values Hypothesis draws from it.

    Attributes:
        codec: the codec under test (not registered anywhere).
        examples: values of the codec's types, awkward ones included (a time zone, a
            NaN, an extreme).
        strategy: optional Hypothesis strategy of values of the codec's types.
        max_examples: how many values the property test draws (default 50).
    """

    codec: ClassVar[Any] = None
    examples: ClassVar[Sequence[Any]] = ()
    strategy: ClassVar[st.SearchStrategy[Any] | None] = None
    max_examples: ClassVar[int] = 50

    @pytest.fixture(autouse=True)
    def _kit_use_the_codec(self) -> Iterator[None]:
        codec = self.codec
        if not isinstance(codec, Codec):
            pytest.fail(
                f"{type(self).__name__}.codec is {codec!r}; set it to your jaxstruct.io.Codec",
                pytrace=False,
            )
        try:
            scope = jio.using(codec)
        except PluginError as err:
            pytest.fail(f"the codec cannot be used as a plugin's would be: {err}", pytrace=False)
        with scope:
            yield

    def _broken(self, promise: str, found: str, fix: str) -> AssertionError:
        return AssertionError(
            f"the codec {self.codec.name!r} breaks a promise: {promise}.\n"
            f"  found: {found}\n  fix: {fix}"
        )

    def assert_same(self, original: Any, restored: Any, how: str) -> None:
        """Assert ``restored`` is ``original`` back: the same type, equal, and the same
        ``repr`` (unless it shows an address). Override it for a type whose values
        compare otherwise.

        Raises:
            AssertionError: naming the promise, the values and the fix.
        """
        if type(restored) is not type(original):
            raise self._broken(
                f"{how} gives back a value of exactly the type it was given",
                f"{original!r} ({type(original).__qualname__}) came back as {restored!r} "
                f"({type(restored).__qualname__})",
                f"decode must return a {type(original).__qualname__}, built from what "
                "encode stored",
            )
        shown = repr(original)
        informative = " at 0x" not in shown  # a repr showing an address says nothing
        try:
            equal: bool | None = bool(original == restored) or (
                _unequal_to_itself(original) and _unequal_to_itself(restored)  # NaN-likes
            )
        except Exception:  # (a signaling NaN refuses comparisons): the repr decides
            equal = None
        if equal is None and not informative:
            raise self._broken(
                "values of the codec's types can be compared",
                f"comparing {original!r} with {restored!r} raised",
                "override assert_same(original, restored, how) in the test class",
            )
        if equal is False or (informative and shown != repr(restored)):
            raise self._broken(
                f"{how} gives back an equal value",
                f"{original!r} came back as {restored!r}",
                "store everything that makes the value what it is (a time zone, fold, "
                "precision, sign), and build the value from all of it in decode",
            )

    def _values(self) -> list[Any]:
        return list(self.examples)

    def _decoded(self, value: Any) -> Any:
        """``decode(encode(value))``; an error of either names the promise it breaks."""
        try:
            return self.codec.decode(self.codec.encode(value))
        except Exception as err:
            raise self._broken(
                "encode and decode accept every value of the codec's types",
                f"on {value!r}: {type(err).__name__}: {err}",
                "handle every value of the types (negative, empty, extreme, special ones)",
            ) from err

    # -- the codec and its examples ------------------------------------------------------------

    def test_examples_hold_a_value_of_each_type(self) -> None:
        """examples is not empty, holds values of the codec's types only, and one of each."""
        values = self._values()
        wrong = [v for v in values if type(v) not in self.codec.types]
        missing = [t for t in self.codec.types if not any(type(v) is t for v in values)]
        if not values or wrong or missing:
            raise AssertionError(
                f"{type(self).__name__}.examples must hold values of the types the codec "
                f"{self.codec.name!r} handles ({[t.__qualname__ for t in self.codec.types]}), "
                f"at least one of each: {'it is empty' if not values else ''}"
                f"{f' {wrong!r} are of other types' if wrong else ''}"
                f"{f' no example of {[t.__qualname__ for t in missing]}' if missing else ''}"
            )

    def test_decode_of_encode_gives_the_value_back(self) -> None:
        """decode(encode(x)) is x back, with exactly its type, for every example."""
        for value in self._values():
            self.assert_same(value, self._decoded(value), "decode(encode(x))")

    def test_state_dict_round_trip(self) -> None:
        """Each example comes back through to_state_dict and from_state_dict, at the root,
        in a list and inside a tuple."""
        for value in self._values():
            for where, wrapped, unwrap in (
                ("a state dict", value, lambda x: x),
                ("a list in a state dict", [value, value], lambda x: x[1]),
                ("a tuple in a state dict", (1, value), lambda x: x[1]),
            ):
                back = self._through_state_dict(wrapped, where)
                self.assert_same(value, unwrap(back), where)

    def _through_state_dict(self, value: Any, where: str) -> Any:
        try:
            return jio.from_state_dict(jio.to_state_dict(value))
        except StructError as err:
            raise self._broken(
                f"values go through {where}",
                str(err),
                "encode must return what jaxstruct stores (None, bools, ints, floats, strs, "
                "bytes, lists, tuples, dicts, NumPy arrays, or values of other codecs), "
                "never the value itself, and decode must accept it back",
            ) from None

    def test_inside_struct_fields_and_dicts(self) -> None:
        """Each example comes back from a struct's node field, a static field (when
        hashable), a dict value and a dict key (when hashable)."""
        for value in self._values():
            hashable = _hashable(value)
            holder = Holder(node=value, static=value if hashable else None)
            back = self._through_state_dict(holder, "a struct's fields")
            self.assert_same(value, back.node, "a struct's node field")
            if hashable:
                self.assert_same(value, back.static, "a struct's static field")
            mapping = {"v": value, **({value: "key"} if hashable else {})}
            back = self._through_state_dict(mapping, "a dict")
            self.assert_same(value, back["v"], "a dict value")
            if hashable:
                keys = [k for k in back if k != "v"]
                if len(keys) != 1:
                    raise self._broken(
                        "a value used as a dict key comes back", repr(keys), "see above"
                    )
                self.assert_same(value, keys[0], "a dict key")

    @pytest.mark.parametrize("container", ["directory", "zip"])
    def test_every_builtin_format(self, container: str, tmp_path: Path) -> None:
        """All the examples, in a struct, a dict and a list, come back from a checkpoint of
        each built-in format."""
        values = self._values()
        tree = {"list": values, "struct": [Holder(node=v) for v in values]}
        try:
            back = jio.load(jio.export(tree, tmp_path / "c", format=container))
        except StructError as err:
            raise self._broken(
                f"values go through a {container} checkpoint",
                str(err),
                "encode must return what jaxstruct stores, and decode accept it back",
            ) from None
        for value, got, held in zip(values, back["list"], back["struct"], strict=True):
            self.assert_same(value, got, f"a {container} checkpoint")
            self.assert_same(value, held.node, f"a struct in a {container} checkpoint")

    def test_drawn_values_round_trip(self) -> None:
        """Values drawn from strategy come back exactly, directly and through a state
        dict (a Hypothesis property; skipped when no strategy is given)."""
        if self.strategy is None:
            pytest.skip(f"{type(self).__name__} sets no strategy to draw values from")

        @settings(
            max_examples=self.max_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            database=None,
        )
        @given(self.strategy)
        def round_trip(value: Any) -> None:
            if type(value) not in self.codec.types:
                raise AssertionError(
                    f"{type(self).__name__}.strategy drew {value!r}, which is not of the "
                    f"codec's types; draw only {[t.__qualname__ for t in self.codec.types]}"
                )
            self.assert_same(value, self._decoded(value), "decode(encode(x))")
            self.assert_same(
                value, self._through_state_dict([value], "a state dict")[0], "a state dict"
            )

        round_trip()
