"""Writing a ``.safetensors`` file: by the safetensors library's writer, or tensor by tensor.

``safetensors.serialize_file`` (the library's Rust writer, safetensors 0.8's
``TensorSpec`` API) writes every tensor straight from its buffer, given by
address and length: no copy of the arrays. It takes all the buffers in one
call, so it writes the file when the arrays are already in host memory in C
order (NumPy arrays, JAX arrays on one CPU device or replicated over CPU
devices), allowing host copies of at most :data:`COPY_BUDGET` bytes in all
for the others (a Fortran-ordered array, an array on an accelerator or split
over devices), reserved from jaxstruct's host budget (``JAXSTRUCT_HOST_BUDGET``,
:func:`jaxstruct.io.reserve_host`) while they live. Beyond that (or beyond the
budget) the file is written here instead, tensor by tensor, each tensor's
bytes streamed in C order within the budget (:func:`jaxstruct.io.host_chunks`:
shards in host memory viewed in place, other pieces copied a few at a time),
so that no tensor is ever copied whole; the layout is the one the library
writes (the header padded with spaces to 8 bytes, tensors by decreasing
alignment then name).

Either way, while a file of :data:`FLUSH_FROM` bytes or more is written, it is
flushed to disk as it is written (:func:`jaxstruct.io.flush_while_writing`), so
the disk writes while the file is still being filled instead of after it; the
fsync ``jaxstruct.io`` makes before publishing the file atomically then has
little left to wait for (0.3 s for 1 GiB became a few ms here; the whole export
gained less, within the machine's noise: see benchmarks/README.md). (The library
itself writes to a temporary sibling of its own and renames that onto the path
it is given: here a path in a directory named after the export's own temporary,
then moved onto that temporary.)
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from jaxstruct.io import (
    flush_while_writing,
    host_array,
    host_budget,
    host_chunks,
    host_pieces,
    reserve_host,
    submit_to_workers,
)
from jaxstruct.registry import SerializationError

from . import _checksums
from ._checksums import CHECKSUMS_KEY, CrcStream, encode_checksums, header_crc, piece_crcs
from ._header import dtype_of, encode_header, numpy_name

__all__ = ["COPY_BUDGET", "FLUSH_FROM", "MAX_HEADER_BYTES", "Tensor", "write_file"]

#: Host copies (in bytes, all arrays together) the library's writer may need
#: before the file is written tensor by tensor instead; they are reserved from the
#: process's host budget, which caps them too.
COPY_BUDGET = 64 << 20


#: Files of at least this many bytes are flushed to disk while they are written.
FLUSH_FROM = 64 << 20

#: The largest header the safetensors library writes or opens (its ``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000


class Tensor(NamedTuple):
    """One tensor to write: its name, safetensors dtype, shape and size in bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def _nbytes(arr: Any) -> int:
    return math.prod(arr.shape) * np.dtype(arr.dtype).itemsize


def _in_place(arr: Any) -> np.ndarray | None:
    """``arr``'s bytes as one C-ordered host array without a copy, or ``None``."""
    if isinstance(arr, np.ndarray):
        return arr if arr.flags.c_contiguous else None
    if not all(d.platform == "cpu" for d in arr.sharding.device_set):
        return None  # an accelerator's array: reading it is a copy
    pieces = host_pieces(arr)  # views of CPU buffers
    if len(pieces) != 1:
        return None
    index, piece = pieces[0]
    whole = all(
        s.start in (None, 0) and s.stop in (None, n) for s, n in zip(index, arr.shape, strict=False)
    )
    return piece if whole and piece.flags.c_contiguous else None


def _to_copy(arrays: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], list[str], int]:
    """The arrays whose bytes lie in host memory in C order (viewed in place), the keys of
    the others, and the bytes of host copies those need."""
    in_place: dict[str, np.ndarray] = {}
    copied: list[str] = []
    for key, arr in arrays.items():
        found = _in_place(arr)
        if found is None:
            copied.append(key)
        else:
            in_place[key] = found
    return in_place, copied, sum(_copy_bytes(arrays[key]) for key in copied)


def _copy_bytes(arr: Any) -> int:
    """The host memory a whole copy of ``arr`` takes at its peak: an array split over
    devices is copied shard by shard, then joined into one buffer."""
    if isinstance(arr, np.ndarray) or len(arr.sharding.device_set) == 1:
        return _nbytes(arr)
    return 2 * _nbytes(arr)


def _with_library(
    path: Any, metadata: Mapping[str, str], plan: Mapping[str, Tensor], buffers: dict
) -> None:
    import safetensors

    specs = {
        t.name: safetensors.TensorSpec(
            dtype=numpy_name(t.dtype),
            shape=list(t.shape),
            data_ptr=buffers[key].ctypes.data,
            data_len=t.nbytes,
        )
        for key, t in plan.items()
    }
    path = Path(path)
    # The library writes a temporary file of its own (mode 0o600) beside the path it
    # is given, then renames it there. It is given a path inside a directory named
    # after jaxstruct's temporary, so that an export killed meanwhile leaves only what
    # jaxstruct.io's sweep of dead writers' leftovers removes; and the file gets the
    # mode a new file gets here. It is then renamed to ``path``, which does not exist
    # yet: renamed over another file, ext4 would write its data out within the rename
    # (0.21-0.27 s for 1 GiB, measured), the fsync's work done in another place.
    scratch = path.with_name(path.name + ".d")
    os.mkdir(scratch)
    try:
        with open(scratch / "mode", "xb") as file:
            mode = os.fstat(file.fileno()).st_mode & 0o7777
        os.unlink(scratch / "mode")  # the directory then holds the library's file alone
        # ``buffers`` holds every array the specs point into until this returns.
        if sum(t.nbytes for t in plan.values()) < FLUSH_FROM:
            safetensors.serialize_file(specs, scratch / "file", metadata=dict(metadata))
        else:
            with flush_while_writing(scratch):  # the file the library writes in it
                safetensors.serialize_file(specs, scratch / "file", metadata=dict(metadata))
        os.chmod(scratch / "file", mode)
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "the temporary path exists", str(path))
        os.rename(scratch / "file", path)
    except safetensors.SafetensorError as err:
        raise _library_error(err) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _library_error(err: Exception) -> SerializationError:
    if "header too large" in str(err):
        return SerializationError(
            "the safetensors header (the tensor names and jaxstruct's manifest) would be "
            f"over the {MAX_HEADER_BYTES:,} bytes safetensors writes and reads; export this "
            'value in another format (a ".zip" path, a directory, or format="orbax")'
        )
    return SerializationError(f"the safetensors library could not write the file: {err}")


def _write_array(file: Any, arr: Any, crcs: CrcStream) -> None:
    """Write ``arr``'s bytes in C order, a piece at a time within the host budget."""
    for piece in host_chunks(arr):
        crcs.feed(piece)
        file.write(piece)
        del piece  # counted against the budget until let go of


def _with_checksums(
    metadata: Mapping[str, str], plan: Mapping[str, Tensor], crcs: Mapping[str, Any]
) -> dict[str, str]:
    """``metadata`` with the checksums entry: ``crcs`` per tensor name, and the header's."""
    layout = [(t.name, dtype_of(t.dtype), t.shape) for t in plan.values()]
    piece = _checksums.PIECE_BYTES
    entry = encode_checksums(header_crc(metadata, layout), piece, crcs)
    return {**metadata, CHECKSUMS_KEY: entry}


def _tensor_by_tensor(
    path: Any, metadata: Mapping[str, str], plan: Mapping[str, Tensor], arrays: Mapping[str, Any]
) -> None:
    """Write the header with placeholder CRCs, the tensors (summed as they go), then the
    header again in place: the CRCs have fixed widths, so it keeps its length."""
    entries = {t.name: (t.dtype, t.shape, t.nbytes) for t in plan.values()}
    piece = _checksums.PIECE_BYTES
    zeros = {t.name: [0] * -(-t.nbytes // piece) for t in plan.values()}
    placeholder = encode_header(_with_checksums(metadata, plan, zeros), entries)
    crcs = {}
    with open(path, "xb") as file, flush_while_writing(path):
        file.write(placeholder)
        for key, tensor in plan.items():
            stream = CrcStream(piece)
            _write_array(file, arrays[key], stream)
            crcs[tensor.name] = stream.result()
        header = encode_header(_with_checksums(metadata, plan, crcs), entries)
        if len(header) != len(placeholder):  # pragma: no cover - fixed-width CRCs
            raise SerializationError("the safetensors header changed length while written")
        file.flush()
        os.pwrite(file.fileno(), header, 0)


def write_file(
    path: Any, metadata: Mapping[str, str], plan: Mapping[str, Tensor], arrays: Mapping[str, Any]
) -> str:
    """Write the file of ``plan`` (array key -> tensor, in file order) at the new ``path``.

    Returns which writer wrote it: ``"safetensors"`` (the library's) or ``"jaxstruct"``.
    """
    buffers, copied, need = _to_copy(arrays)
    if need > min(COPY_BUDGET, host_budget()):
        _tensor_by_tensor(path, metadata, plan, arrays)
        return "jaxstruct"
    # The copies are held, reserved from the host budget, while the library writes from them.
    with reserve_host(need) if need else contextlib.nullcontext():
        for key in copied:
            buffers[key] = np.ascontiguousarray(host_array(arrays[key]))
        piece = _checksums.PIECE_BYTES
        summing = {
            t.name: submit_to_workers(piece_crcs, buffers[key], piece, checksums=True)
            for key, t in plan.items()
        }
        crcs = {name: future.result() for name, future in summing.items()}
        _with_library(path, _with_checksums(metadata, plan, crcs), plan, buffers)
        del buffers
    return "safetensors"
