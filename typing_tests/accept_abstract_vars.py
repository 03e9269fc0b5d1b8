"""Ways to provide an ``AbstractVar`` that every checker accepts (a property: mypy only).

A computed value is provided by a derived field, which pyright reads as a field
the constructor does not take.
"""

from typing import ClassVar

import jaxstruct.core as js
from jaxstruct.abc import AbstractVar
from typing_extensions import assert_type


class Base(js.Struct):
    w: float
    name: AbstractVar[str]

    def describe(self) -> str:
        return self.name


class ByField(Base):
    name: str = js.field(static=True, default="field")


class ByDerivedField(Base):
    name: str = js.field(static=True, init=False, derived=lambda self: f"w={self.w}")


class ByClassVar(Base):
    tag: ClassVar[str] = "cv"
    name: str = js.field(static=True, default=tag)


assert_type(ByField(1.0, "x").name, str)
assert_type(ByDerivedField(w=1.0).name, str)
assert_type(ByDerivedField(1.0).replace(w=2.0), ByDerivedField)
assert_type(ByClassVar(w=1.0).describe(), str)
