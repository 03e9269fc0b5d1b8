"""Property-based testing of structs: Hypothesis strategies and round-trip assertions, and
the conformance tests of format and codec plugins (``FormatTests``, ``CodecTests``, which
need pytest).

Installing ``jaxstruct-testing`` also makes ``st.from_type(MyStruct)`` work
(through Hypothesis's ``hypothesis`` entry point) and adds the pytest
fixtures ``assert_roundtrip`` and ``assert_pytree_roundtrip``.

Names are imported on first use (PEP 562): the Hypothesis entry point and the
pytest plugin live in this package and must not import JAX at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._arrays import arrays
    from ._assertions import FORMATS, assert_pytree_roundtrip, assert_roundtrip
    from ._classes import struct_classes
    from ._codec_tests import CodecTests
    from ._compare import first_difference
    from ._format_tests import FormatTests
    from ._refusals import RefusalWarning
    from ._strategies import hashable_values, structs

_WHERE = {
    "CodecTests": "._codec_tests",
    "FORMATS": "._assertions",
    "FormatTests": "._format_tests",
    "RefusalWarning": "._refusals",
    "arrays": "._arrays",
    "assert_pytree_roundtrip": "._assertions",
    "assert_roundtrip": "._assertions",
    "first_difference": "._compare",
    "hashable_values": "._strategies",
    "struct_classes": "._classes",
    "structs": "._strategies",
}

__all__ = [
    "FORMATS",
    "CodecTests",
    "FormatTests",
    "RefusalWarning",
    "arrays",
    "assert_pytree_roundtrip",
    "assert_roundtrip",
    "first_difference",
    "hashable_values",
    "struct_classes",
    "structs",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxstruct.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
