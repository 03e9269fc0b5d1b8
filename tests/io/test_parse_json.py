"""jaxstruct.io.parse_json: the one strict JSON reader the formats share."""

from __future__ import annotations

import jaxstruct.io as jio
import pytest
from jaxstruct.registry import SerializationError


def test_parses_bytes_and_text() -> None:
    """UTF-8 bytes and strings give the same value."""
    assert jio.parse_json(b'{"a": [1, 2.5, "x"]}', "f") == {"a": [1, 2.5, "x"]}
    assert jio.parse_json('{"a": null}', "f") == {"a": None}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"a": 1, "a": 2}', "f: malformed header: duplicate JSON key 'a'"),
        (b'{"a": {"b": 1, "b": 1}}', "f: malformed header: duplicate JSON key 'b'"),
        (b'{"a": NaN}', "f: malformed header: JSON literal NaN is not allowed"),
        (b"[-Infinity]", "f: malformed header: JSON literal -Infinity is not allowed"),
        (b'{"a": 1', "f: header is not valid JSON"),
        (b'"\xff"', "f: header is not UTF-8 text"),
        (b"[" * 100_000, "f: header JSON is nested too deeply"),
    ],
)
def test_what_json_loads_lets_through_is_our_error(data: bytes, message: str) -> None:
    """Duplicate keys, NaN/Infinity, bad UTF-8, bad JSON and deep nesting name the file."""
    with pytest.raises(SerializationError) as info:
        jio.parse_json(data, "f", "header")
    assert str(info.value).startswith(message)
