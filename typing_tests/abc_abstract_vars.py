"""pyright must see abstract vars as attributes of the abstract base and its subclasses.

AbstractClassVar is imported as ClassVar under TYPE_CHECKING: pyright does not
recognise a ClassVar alias imported from another module (pyright#4965), the
same workaround equinox documents.
"""

from typing import TYPE_CHECKING, ClassVar

import jaxstruct.core as js
from jaxstruct.abc import AbstractVar, StructABCMeta
from typing_extensions import assert_type

if TYPE_CHECKING:
    from typing import ClassVar as AbstractClassVar
else:
    from jaxstruct.abc import AbstractClassVar


class AbstractModel(js.Struct, metaclass=StructABCMeta):
    weights: float
    name: AbstractVar[str]
    kind: AbstractClassVar[str]

    def describe(self) -> str:
        return f"{self.kind}:{self.name}"


class Model(AbstractModel):
    name: str = js.field(static=True, default="m")
    kind: ClassVar[str] = "dense"


def use(model: AbstractModel) -> str:
    assert_type(model.name, str)
    assert_type(model.kind, str)
    assert_type(model.weights, float)
    return model.describe()


m = Model(weights=1.0, name="x")
assert_type(m.name, str)
assert_type(Model.kind, str)
use(m)
bad: int = m.name  # pyright: ignore[reportAssignmentType]  # a str attribute, not an int
