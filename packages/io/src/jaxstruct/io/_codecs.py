"""Value codecs: how a type the manifest cannot hold natively is stored."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

__all__ = ["Codec"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


@dataclasses.dataclass(frozen=True)
class Codec:
    """A named pair of functions storing values of some exact types.

    ``encode`` turns a value into anything ``jaxstruct.io`` can store (plain
    JSON values, containers, arrays, other codec values); ``decode`` receives
    that stored value back and returns the original. The manifest records only
    ``name``; loading looks it up among registered codecs and never imports a
    module.

    Attributes:
        name: unique registration name recorded in manifests.
        types: the exact classes handled (subclasses are not matched, so
            nothing changes type silently).
        encode: ``value -> storable``.
        decode: ``storable -> value``.

    Example:
        >>> import fractions
        >>> codec = Codec(
        ...     "fraction",
        ...     (fractions.Fraction,),
        ...     encode=lambda f: (f.numerator, f.denominator),
        ...     decode=lambda pair: fractions.Fraction(*pair),
        ... )
        >>> codec.decode(codec.encode(fractions.Fraction(3, 4)))
        Fraction(3, 4)
    """

    name: str
    types: tuple[type, ...]
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise TypeError(
                f"Codec name must match {_NAME.pattern!r} (letters, digits, '_', '.', '-'), "
                f"got {self.name!r}"
            )
        types = tuple(self.types) if not isinstance(self.types, type) else (self.types,)
        if not types or not all(isinstance(t, type) for t in types):
            raise TypeError(f"Codec {self.name!r}: types must be a non-empty tuple of classes")
        object.__setattr__(self, "types", types)
        if not callable(self.encode) or not callable(self.decode):
            raise TypeError(f"Codec {self.name!r}: encode and decode must be callable")
