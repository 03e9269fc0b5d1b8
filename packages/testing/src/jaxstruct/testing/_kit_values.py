"""What the plugin kit stores and how it damages it: sample arrays of every dtype jaxstruct
stores, random trees, exact comparison, and the damaged copies of a checkpoint."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st

from ._compare import first_difference

#: The ml_dtypes dtypes jaxstruct stores, where the installed ml_dtypes has them.
ML_DTYPES = (
    "bfloat16",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "int1",
    "int2",
    "int4",
    "uint1",
    "uint2",
    "uint4",
)
_N = 37  # an odd length: no dtype's bytes line up with a power of two by luck


def _ml_dtypes() -> dict[str, np.dtype]:
    import ml_dtypes

    return {
        name: np.dtype(getattr(ml_dtypes, name)) for name in ML_DTYPES if hasattr(ml_dtypes, name)
    }


def dtype_samples() -> dict[str, np.ndarray]:
    """One array of every dtype jaxstruct stores, named by its dtype (``">f8"`` for the
    big-endian float64), each holding its dtype's awkward values (NaN, infinities, ``-0.0``,
    extremes) where it has them."""
    rng = np.random.default_rng(47)
    out: dict[str, np.ndarray] = {"bool": rng.integers(0, 2, _N).astype(bool)}
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        info = np.iinfo(name)
        out[name] = rng.integers(info.min, info.max, _N, dtype=name, endpoint=True)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25])
    floats = np.concatenate([specials, rng.normal(0, 100, _N - len(specials))])
    for name in ("float16", "float32", "float64"):
        with np.errstate(over="ignore"):
            out[name] = floats.astype(name)
    if np.dtype(np.longdouble).itemsize > 8:
        out["longdouble"] = floats.astype(np.longdouble)
    pairs = np.empty(_N, np.complex128)  # (1j * inf is nan + inf j: set the parts instead)
    pairs.real, pairs.imag = floats, floats[::-1]
    out["complex64"] = pairs.astype(np.complex64)
    out["complex128"] = pairs
    out[">i4"] = out["int32"].astype(">i4")
    out[">f8"] = floats.astype(">f8")
    out[">c16"] = out["complex128"].astype(">c16")
    for name, dtype in _ml_dtypes().items():
        if dtype.kind in "iu" or name.startswith(("int", "uint")):
            info = _int_range(name)
            out[name] = (np.arange(_N) % (info[1] - info[0] + 1) + info[0]).astype(dtype)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                out[name] = floats.astype(np.float32).astype(dtype)
    out["bytes"] = np.array([b"", b"a", b"\x00b\x00", b"hello"], dtype="S5")
    out["str"] = np.array(["", "é", "ab\x00", "✓✓✓"], dtype="U3")
    out["void"] = np.frombuffer(bytes(range(16)), dtype="V4").copy()
    out["datetime64"] = np.array(["2026-12-07T01:02:03.000000004", "NaT"], dtype="datetime64[ns]")
    out["timedelta64"] = np.array([-3, 0, 86400], dtype="timedelta64[s]")
    return out


def _int_range(name: str) -> tuple[int, int]:
    bits = int(name.removeprefix("u").removeprefix("int"))
    if name.startswith("u"):
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def difference(expected: Any, actual: Any, path: str = "x") -> str | None:
    """The first difference (type, dtype, shape, bits), or where a NumPy array in Fortran
    order came back in another order, or ``None``."""
    found = first_difference(expected, actual, path)
    if found is not None:
        return found
    return _order_difference(expected, actual, path)


def _order_difference(expected: Any, actual: Any, path: str) -> str | None:
    stack = [(expected, actual, path)]
    while stack:
        a, b, where = stack.pop()
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            fortran = a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous
            if fortran and not b.flags.f_contiguous:
                return f"{where}: stored in Fortran order, loaded in C order"
        elif isinstance(a, dict) and isinstance(b, dict):
            stack += [(a[k], b[k], f"{where}[{k!r}]") for k in a if k in b]
        elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
            stack += [(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=False))]
    return None


_KEYS = st.sampled_from(["", "a", "b.c", "d/e", "%", "~", "ünï", "w", "0", "0.1"])


def _leaf_arrays() -> st.SearchStrategy[np.ndarray]:
    dtypes = st.sampled_from(["bool", "int8", "int32", "uint16", "float32", "float64", "complex64"])
    shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)

    @st.composite
    def draw_array(draw: st.DrawFn) -> np.ndarray:
        dtype, shape = np.dtype(draw(dtypes)), draw(shapes)
        raw = draw(
            st.binary(
                min_size=math.prod(shape) * dtype.itemsize,
                max_size=math.prod(shape) * dtype.itemsize,
            )
        )
        data = np.frombuffer(raw, np.uint8).reshape(-1)
        if dtype == np.dtype(bool):  # (only 0 and 1 are bools)
            arr = (data % 2).astype(bool).reshape(shape)
        else:
            arr = data.copy().view(dtype).reshape(shape)
        return np.asfortranarray(arr) if draw(st.booleans()) else arr

    return draw_array()


def trees() -> st.SearchStrategy[Any]:
    """Random trees: NumPy arrays of a few dtypes, shapes (empty and 0-d too) and memory
    orders, with small scalars, in dicts with awkward keys, lists and tuples."""
    leaves = _leaf_arrays() | st.integers(-5, 5) | st.text(max_size=3) | st.none()
    return st.recursive(
        leaves,
        lambda inner: (
            st.dictionaries(_KEYS, inner, max_size=3)
            | st.lists(inner, max_size=3)
            | st.lists(inner, max_size=2).map(tuple)
        ),
        max_leaves=8,
    )


def files_of(path: Path) -> list[Path]:
    """The regular files a checkpoint consists of: itself, or those under its directory."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def copy_checkpoint(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


class Damage(NamedTuple):
    """One way of damaging a copy of a checkpoint: a name for messages, and what it does to
    the copy (given the copy's path)."""

    name: str
    apply: Callable[[Path], None]


def _file_at(root: Path, relative: Path) -> Path:
    return root if relative == Path(".") else root / relative


def _truncate(relative: Path, size: int) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        with open(_file_at(root, relative), "r+b") as handle:
            handle.truncate(size)

    return apply


def _rewrite(relative: Path, make: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        file = _file_at(root, relative)
        file.write_bytes(make(file.read_bytes()))

    return apply


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]


def damages(checkpoint: Path, *, flips: int = 20) -> Iterator[Damage]:
    """Ways to damage ``checkpoint``: each file cut short (to nothing, one byte, a quarter,
    half, all but one byte), replaced by random bytes or zeros, bytes flipped across it,
    and (in a directory) removed."""
    files = files_of(checkpoint)
    rng = np.random.default_rng(45)
    base = checkpoint if checkpoint.is_dir() else checkpoint.parent
    per_file = max(4, flips // max(1, len(files)))
    for file in files:
        relative = Path(".") if file == checkpoint else file.relative_to(base)
        size = file.stat().st_size
        label = "the checkpoint" if file == checkpoint else f"member {relative.as_posix()!r}"
        for cut in sorted({0, 1, size // 4, size // 2, size - 1}):
            if 0 <= cut < size:
                yield Damage(f"{label} cut to {cut} of {size} bytes", _truncate(relative, cut))
        noise = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        yield Damage(f"{label} replaced by random bytes", _rewrite(relative, lambda _, n=noise: n))
        yield Damage(f"{label} replaced by zeros", _rewrite(relative, lambda d: bytes(len(d))))
        for at in np.linspace(0, max(0, size - 1), min(size, per_file)).astype(int).tolist():
            yield Damage(
                f"{label}: byte {at} of {size} changed",
                _rewrite(relative, lambda d, a=at: _flip(d, a)),
            )
        if file != checkpoint:
            yield Damage(f"{label} removed", lambda root, r=relative: os.remove(root / r))


def flip_inside(checkpoint: Path, needle: bytes) -> Damage | None:
    """A damage changing one byte in the middle of ``needle`` where a file of the checkpoint
    holds it verbatim, or ``None`` (the format encodes or compresses it)."""
    base = checkpoint if checkpoint.is_dir() else checkpoint.parent
    for file in files_of(checkpoint):
        at = file.read_bytes().find(needle)
        if at >= 0:
            relative = Path(".") if file == checkpoint else file.relative_to(base)
            middle = at + len(needle) // 2
            return Damage(
                f"byte {middle} of {file.name!r}",
                _rewrite(relative, lambda d, at=middle: _flip(d, at)),
            )
    return None


def size_of(checkpoint: Path) -> int:
    return sum(f.stat().st_size for f in files_of(checkpoint))
