"""An argument the field's converter does not accept is rejected."""

import jaxstruct.core as js


def to_int(value: str | int) -> int:
    return int(value)


class Counter(js.Struct):
    n: int = js.field(static=True, converter=to_int)


Counter(n=[3])  # expected-error
Counter(n=3).n.upper()  # expected-error
