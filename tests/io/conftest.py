"""Shared fixtures for the jaxstruct.io tests: exact comparison and the three round-trip forms."""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest

# "tar" is the format of the example plugin jaxstruct-plugin-tar (a workspace dev
# dependency): every round trip also goes through a third-party format, and through
# jaxstruct-safetensors, a format on a file layout jaxstruct does not define.
FORMS = ("state", "directory", "zip", "tar", "orbax", "safetensors")


def _bits(x: float) -> bytes:
    return struct.pack(">d", x)


def assert_same(a: Any, b: Any) -> None:
    """Assert that ``b`` equals ``a`` leaf by leaf, types, dtypes and bits included."""
    stack: list[tuple[Any, Any, str]] = [(a, b, "root")]
    while stack:
        x, y, path = stack.pop()
        assert type(x) is type(y), f"{path}: {type(x)} != {type(y)}"
        if isinstance(x, jax.Array):
            assert x.weak_type == y.weak_type, f"{path}: weak_type {x.weak_type} != {y.weak_type}"
            x, y = np.asarray(x), np.asarray(y)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, (
                f"{path}: {x.dtype}{x.shape} != {y.dtype}{y.shape}"
            )
            assert x.tobytes() == y.tobytes(), f"{path}: array bits differ"
            assert (
                x.flags.f_contiguous == y.flags.f_contiguous
                or x.ndim < 2
                or not x.flags.f_contiguous
            )
        elif isinstance(x, np.generic):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f"{path}: {x!r} != {y!r}"
        elif type(x) is float:
            assert _bits(x) == _bits(y), f"{path}: {x!r} != {y!r}"
        elif type(x) is complex:
            assert _bits(x.real) == _bits(y.real) and _bits(x.imag) == _bits(y.imag), path
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), f"{path}: lengths differ"
            stack.extend((p, q, f"{path}[{i}]") for i, (p, q) in enumerate(zip(x, y, strict=True)))
        elif isinstance(x, dict):
            assert list(x) == list(y), f"{path}: keys {list(x)!r} != {list(y)!r}"
            stack.extend((x[k], y[k], f"{path}[{k!r}]") for k in x)
        elif isinstance(x, js.Struct):
            for name, spec in js.fields(x).items():
                if spec.should_serialize or spec.is_derived:
                    stack.append((getattr(x, name), getattr(y, name), f"{path}.{name}"))
        elif dataclasses.is_dataclass(x) or (hasattr(x, "__dict__") and not isinstance(x, type)):
            stack.append((vars(x), vars(y), f"{path}.__dict__"))
        else:
            assert x == y, f"{path}: {x!r} != {y!r}"
            if isinstance(x, float) and math.isnan(x):  # pragma: no cover
                pass


@pytest.fixture
def same() -> Callable[[Any, Any], None]:
    """The exact comparison."""
    return assert_same


@pytest.fixture(params=FORMS)
def form(request: pytest.FixtureRequest) -> str:
    """Each form: state dict, directory, zip, and the example plugin's tar."""
    return request.param


@pytest.fixture
def roundtrip(form: str, tmp_path: Path) -> Callable[..., Any]:
    """Return ``f(x, **load_kw)`` giving ``x`` back through the current form."""
    counter = iter(range(1_000_000))

    def run(value: Any, **kw: Any) -> Any:
        if form == "state":
            return jio.from_state_dict(jio.to_state_dict(value), **kw)
        suffix = {"zip": ".zip", "tar": ".tar", "safetensors": ".safetensors"}.get(form, "")
        path = tmp_path / f"ckpt{next(counter)}{suffix}"
        jio.export(value, path, format="orbax" if form == "orbax" else None)
        return jio.load(path, **kw)

    return run
