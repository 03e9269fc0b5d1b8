"""The public extension points in jaxstruct.core.extend."""

from __future__ import annotations

import jax
import jaxstruct.core as js
import pytest
from jaxstruct.core import extend


def test_class_keyword_callback_and_options() -> None:
    """A registered class keyword reaches its callback and class_options, and is inherited."""
    calls: list[tuple[str, object]] = []
    extend.add_class_keyword("_test_color", lambda cls, v: calls.append((cls.__name__, v)))

    class Red(js.Struct, _test_color="red"):  # type: ignore[call-arg]
        x: int

    class Redder(Red):
        y: int = 0

    assert calls == [("Red", "red")]
    assert js.class_options(Redder)["_test_color"] == "red"


def test_unknown_class_keyword_is_still_an_error() -> None:
    """A keyword nobody registered is rejected as before."""
    with pytest.raises(TypeError):

        class Bad(js.Struct, _test_no_such_keyword=1):  # type: ignore[call-arg]
            x: int


def test_bad_keyword_names_and_callbacks_are_rejected() -> None:
    """Struct's own keywords and non-identifiers cannot be taken over."""
    for name in ("init", "overwrite_parent_init", "not an identifier"):
        with pytest.raises(ValueError, match="cannot be a class keyword"):
            extend.add_class_keyword(name, lambda cls, v: None)
    with pytest.raises(TypeError, match="callable"):
        extend.add_class_keyword("_test_x", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        extend.add_class_hook(3)  # type: ignore[arg-type]


def test_a_rejected_class_is_never_registered_as_a_pytree() -> None:
    """A hook that raises stops the class before JAX or the registry know it."""
    seen: list[type] = []

    def reject(cls: type) -> None:
        if cls.__name__ == "Rejected":
            seen.append(cls)
            raise js.StructDefinitionError("Rejected: not today")

    extend.add_class_hook(reject)
    extend.add_class_hook(reject)  # once per hook
    with pytest.raises(js.StructDefinitionError, match="not today"):

        class Rejected(js.Struct):
            x: int

    (cls,) = seen
    assert not js.is_registered_pytree_type(cls)
    instance = object.__new__(cls)
    assert jax.tree_util.tree_leaves(instance) == [instance]  # a leaf: unknown to JAX

    class Accepted(js.Struct):
        x: int

    assert js.is_registered_pytree_type(Accepted)


def test_non_field_marker_skips_string_annotations() -> None:
    """A marker name makes a string annotation declare no field (like ClassVar)."""
    extend.add_non_field_marker("_TestMarker")

    class Marked(js.Struct):
        __annotations__ = {"x": "int", "y": "_TestMarker[int]"}

    assert Marked.fields().keys() == {"x"}
