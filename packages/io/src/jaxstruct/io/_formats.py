"""The format protocol, what a manager needs at a URL, and tree paths of a manifest's arrays.

Also what formats and the modules around them share about paths: a URL or a local
path (:func:`local_or_url`), and "has this file changed" (:func:`identity`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from jaxstruct.registry import SerializationError

from . import _host
from ._nodes import ARRAY_TAGS, TREE_ROLES, children, escape_step, tree_step
from ._schema import DEFAULT_LIMITS, Limits, parse_manifest


class ManifestNode(NamedTuple):
    """One node of a manifest, as :func:`walk` yields it.

    Attributes:
        path: its tree path, as :func:`jaxstruct.io.join_path` writes its steps (``""``
            for the root, which has none).
        tag: the node's tag (``"struct"``, ``"dict"``, ``"array"``, ...).
        node: the node itself (a JSON list; see the manifest layout in the io guide).
    """

    path: str
    tag: str
    node: list[Any]


def walk(manifest: bytes | str | Mapping[str, Any]) -> Iterator[ManifestNode]:
    """Yield every node reachable from the root with its tree path, parents first.

    Args:
        manifest: the manifest bytes a format's ``write`` receives (or
            ``OpenedCheckpoint.manifest``), or that JSON already parsed.

    Raises:
        ValueError: it is not a well-formed manifest.

    Example:
        >>> import numpy as np
        >>> from jaxstruct.io import to_state_dict
        >>> state = to_state_dict({"w": np.zeros(2)})
        >>> [(n.path, n.tag) for n in walk(state)]
        [('', 'dict'), ('w', 'array')]
    """
    top = json.loads(manifest) if isinstance(manifest, (bytes, str)) else manifest
    inner = top.get("manifest", top) if isinstance(top, Mapping) else None
    if not isinstance(inner, Mapping) or not isinstance(inner.get("nodes"), list):
        raise ValueError("not a jaxstruct manifest (expected 'manifest' with 'root' and 'nodes')")
    nodes, root = inner["nodes"], inner.get("root")
    if type(root) is not int or not 0 <= root < len(nodes):
        raise ValueError("the manifest's root is not a node index")
    # A path of None is the root's (no step): "" is the path of one empty step's parent
    # no more than of the root, so emptiness cannot tell them apart.
    stack: list[tuple[int, str | None]] = [(root, None)]
    seen = 0
    while stack:
        index, path = stack.pop()
        seen += 1
        if seen > len(nodes):
            raise ValueError("the manifest's nodes do not form a tree")
        node = nodes[index]
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise ValueError(f"node {index} is malformed")
        yield ManifestNode(path or "", node[0], node)
        try:
            kids = [(c, tree_step(nodes, c)) for c in children(node) if c.role in TREE_ROLES]
        except (TypeError, ValueError):
            raise ValueError(f"node {index} is malformed") from None
        for child, step in reversed(kids):
            if type(child.index) is not int or not 0 <= child.index < index:
                raise ValueError(f"node {index} has an invalid child index")
            joined = path if step is None else (step if path is None else f"{path}.{step}")
            stack.append((child.index, joined))


def array_paths(manifest: bytes | str | Mapping[str, Any]) -> dict[str, str]:
    """Return ``array key -> tree path`` for every array of a manifest (in tree order).

    A format's ``write`` gets the manifest bytes and the arrays by key; this
    names each array by where it sits (``params.layers.0.w``). On read, the
    same call on ``OpenedCheckpoint.manifest`` gives the same names back.

    A path is :func:`jaxstruct.io.join_path` of its steps: every step is kept
    (the dict key ``""`` is the step ``%``), so two different places never get
    one path, and an array at the root has the empty path ``""``. Only where
    two keys of one dict have the same text (``1`` and ``"1"``) does the later
    get ``~`` and its array key appended (``1~a4``).

    Raises:
        ValueError: it is not a well-formed manifest.

    Example:
        >>> import numpy as np
        >>> from jaxstruct.io import to_state_dict
        >>> state = to_state_dict({"params": {"layers": [{"w": np.ones(1)}], "lr.x": np.ones(1)}})
        >>> array_paths(state)
        {'a0': 'params.layers.0.w', 'a1': 'params.lr%2Ex'}
    """
    out: dict[str, str] = {}
    taken: set[str] = set()
    for entry in walk(manifest):
        if entry.tag not in ARRAY_TAGS or len(entry.node) < 2:
            continue
        key = entry.node[1]
        path = entry.path
        if path in taken:
            path = f"{path}~{escape_step(str(key))}"
        taken.add(path)
        out[str(key)] = path
    return out


#: A path that names a URL (``gs://bucket/ck``, ``memory://x``) rather than a local file.
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str) -> bool:
    """Return whether ``path`` looks like a URL (``gs://bucket/ck``, ``memory://x``)."""
    return URL.match(path) is not None


def local_or_url(path: str | os.PathLike[str], what: str) -> Any:
    """``path`` as a :class:`~pathlib.Path`, or as the string of a URL."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"{what}() expected a str or os.PathLike path, got {path!r}")
    return text if URL.match(text) else Path(text)


def identity(path: Any, *, follow: bool = True) -> tuple[int, ...] | None:
    """What changes when ``path`` is replaced or edited (device, inode, size, modification
    and change times), or ``None`` when nothing is there: "has this file changed"."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return stat_identity(st)


def stat_identity(st: os.stat_result) -> tuple[int, ...]:
    """:func:`identity` of a file already stat-ed (``os.fstat`` of an open one)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class RemoteDirectory:
    """Operations on objects under URLs, given by :meth:`Format.remote_directory`."""

    def names(self, url: str) -> list[str]:
        """Return the names directly under ``url`` (``[]`` when there is none)."""
        raise NotImplementedError

    def committed(self, url: str) -> bool:
        """Return whether ``url`` holds a checkpoint whose commit marker exists."""
        raise NotImplementedError

    def read_text(self, url: str) -> str | None:
        """Return the text of the object ``url``, or ``None`` if it does not exist."""
        raise NotImplementedError

    def write_text(self, url: str, text: str) -> None:
        """Write the object ``url`` (replaced as a whole)."""
        raise NotImplementedError

    def remove(self, url: str) -> None:
        """Remove the object ``url`` if it exists."""
        raise NotImplementedError

    def delete_checkpoint(self, url: str) -> None:
        """Delete the checkpoint at ``url``: its commit marker first, then every object."""
        raise NotImplementedError

    def stage_replacement(self, url: str) -> str:
        """Return where a checkpoint replacing the one at ``url`` is written (process 0 only).

        ``url`` itself when nothing is there. A replacement interrupted midway is
        finished first, a staged one never committed is removed.

        Raises:
            SerializationError: something other than a committed checkpoint is at ``url``.
        """
        raise NotImplementedError

    def commit_replacement(self, staged: str, url: str) -> None:
        """Make the committed checkpoint at ``staged`` the one at ``url``, then remove
        ``staged``; at every instant, loading ``url`` gives the old or the new one."""
        raise NotImplementedError


class ArraySpec(NamedTuple):
    """What the manifest says about one stored array: dtype, shape and size in bytes."""

    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int


#: Where :meth:`OpenedCheckpoint.read_arrays` puts an array: a sharding, or ``None`` for host.
Placement = Any  # jax.sharding.Sharding | None (jax is imported lazily)

ArrayTable = Mapping[str, ArraySpec]


_ALIGN = 64


def aligned_empty(nbytes: int) -> np.ndarray:
    """Return an uninitialised ``uint8`` buffer of ``nbytes`` whose address is 64-byte aligned
    (the allocator under :func:`empty_array`, for readers that fill raw bytes first)."""
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + nbytes]


def empty_array(spec: ArraySpec, order: str = "C") -> np.ndarray:
    """Allocate the host array :meth:`OpenedCheckpoint.read_arrays` returns for ``spec``.

    Its buffer starts at a 64-byte boundary (so ``jax.device_put`` can adopt
    it without a copy), it is uninitialised, and it is laid out in ``order``
    (``"C"``, or ``"F"`` for an array stored in Fortran order). Read the stored
    bytes into ``memoryview(arr.reshape(-1, order=order).view(numpy.uint8))``.
    It is io's one aligned allocator: a format plugin's ``read_arrays`` uses it
    rather than an allocator of its own.

    Example:
        >>> import numpy as np
        >>> arr = empty_array(ArraySpec(np.dtype("<f4"), (2, 3), 24), order="F")
        >>> arr.shape, arr.flags.f_contiguous, arr.ctypes.data % 64
        ((2, 3), True, 0)
    """
    dtype = np.dtype(spec.dtype)
    flat = aligned_empty(math.prod(spec.shape) * dtype.itemsize).view(dtype)
    return flat.reshape(tuple(spec.shape), order="F" if order == "F" else "C")


def host_pieces(arr: Any) -> list[tuple[tuple[slice, ...], np.ndarray]]:
    """Return ``(index, host piece)`` for each distinct block of ``arr`` this process holds.

    A NumPy array is one block. A ``jax.Array`` gives one piece per distinct
    shard index among its addressable shards (replicas once), so the whole array
    is never gathered into one buffer. Shards in host memory (CPU devices) are
    viewed in place; shards in accelerator memory are copied through fresh device
    arrays (JAX caches a host copy on the array it was made from: on the user's
    array's shards it would keep the model in host memory after the export).

    Raises:
        SerializationError: a copy from a device failed.
    """
    if isinstance(arr, np.ndarray):
        return [((), arr)]
    seen: dict[tuple[Any, ...], tuple[tuple[slice, ...], Any]] = {}
    for shard in arr.addressable_shards:
        index = tuple(shard.index)
        marker = tuple((s.start, s.stop, s.step) for s in index)
        if marker not in seen:
            seen[marker] = (index, shard.data)
    if not _host.streams(arr):
        return [(index, np.asarray(data)) for index, data in seen.values()]
    what = f"an array of shape {tuple(arr.shape)} and dtype {arr.dtype}"
    copies = _host.fresh_copies(what, [data for _, data in seen.values()])
    return [(index, copy) for (index, _), copy in zip(seen.values(), copies, strict=True)]


def host_array(arr: Any) -> np.ndarray:
    """Return ``arr`` as one host NumPy array (a generic fallback for simple formats).

    Built from :func:`host_pieces`; refuses an array whose blocks this
    process does not all hold.
    """
    if isinstance(arr, np.ndarray):
        return arr
    pieces = host_pieces(arr)
    if len(pieces) == 1 and all(
        (s.start in (None, 0)) and (s.stop is None or s.stop == n)
        for s, n in zip(pieces[0][0], arr.shape, strict=False)
    ):
        return pieces[0][1]
    out = np.empty(arr.shape, dtype=arr.dtype)
    covered = 0
    for index, piece in pieces:
        out[index] = piece
        covered += piece.size
    if covered < out.size:
        raise SerializationError(
            f"an array of shape {arr.shape} is not entirely held by this process; "
            'export it with format="orbax", which writes each process\'s shards'
        )
    return out


def place(host: np.ndarray, placement: Placement) -> Any:
    """Put a host array where ``placement`` says: ``None`` keeps it, a sharding makes a jax.Array.

    Each addressable device receives only its own slice (the generic fallback
    for formats that cannot read slices themselves).
    """
    if placement is None:
        return host
    import jax

    if host.dtype == object:  # pragma: no cover - never stored
        raise SerializationError("object arrays cannot be placed on devices")
    return jax.make_array_from_callback(host.shape, placement, lambda index: host[index])


#: What :func:`jaxstruct.io.inspect` reports as a checkpoint's checksums when its format
#: does not say (its opened checkpoint sets no ``checksum_scheme``).
CHECKSUMS_NOT_STATED = "not stated by the format"


class OpenedCheckpoint:
    """A checkpoint opened for reading: its manifest bytes, and its arrays on demand.

    Two methods are optional (their defaults check nothing): :meth:`verify`, for
    a format storing checksums, and :meth:`check_members`, which export uses to
    check what a format wrote before it replaces a previous checkpoint.

    ``manifest`` is ``None`` for a file of the format that another tool wrote,
    without a jaxstruct manifest: :meth:`tensors` then lists what it holds, and
    :func:`jaxstruct.io.load` fills a ``target=`` from it by tree path.

    Attributes:
        manifest: the stored manifest bytes, or ``None`` (see above).
        checksum_scheme: what protects the stored bytes, in words, as
            :func:`jaxstruct.io.inspect` reports it (``"CRC-32 of every member"``;
            ``"none: written by another tool"``). Optional: by default
            ``"not stated by the format"``.
        loads_flat: for a checkpoint without a manifest, whether :meth:`tensors` is
            everything it holds (a safetensors file is names and tensors), so that
            ``load(path)`` without ``target=`` may return them as a dict
            ``{name: array}``. Optional: by default such a load asks for a target.
        arrays_checked: whether this opened file carries the format's own
            checksums of every stored byte of every array, found intact, so that
            every :meth:`read_arrays` checks what it reads. Only a format that
            declares :attr:`Format.checks_arrays` sets it, from the file's own
            marks; a checkpoint whose manifest says its format checks its arrays
            is refused when its opened checkpoint does not say so. Optional: by
            default ``False``.
    """

    manifest: bytes | None
    checksum_scheme: str = CHECKSUMS_NOT_STATED
    loads_flat: bool = False
    arrays_checked: bool = False

    def tensors(self) -> dict[str, ArraySpec]:
        """The stored tensors of a checkpoint without a manifest: ``name -> ArraySpec``.

        Names are tree paths as :func:`jaxstruct.io.join_path` writes them
        (``params.layers.0.w``); :meth:`read_arrays` then takes these names as keys.
        """
        raise NotImplementedError

    def read_arrays(self, table: ArrayTable, wanted: Mapping[str, Placement]) -> dict[str, Any]:
        """Read the arrays named in ``wanted`` and put each where its placement says.

        Args:
            table: the whole arrays table of the manifest, ``key -> ArraySpec``;
                check it against what the container holds.
            wanted: the keys to read (a subset for partial restore; other keys
                are never read) mapped to a placement: ``None`` for a host
                NumPy array with a 64-byte aligned buffer (allocate it with
                :func:`empty_array`), a ``jax.sharding.Sharding`` for a
                ``jax.Array`` with exactly that sharding (use :func:`place` as
                a fallback).

        Returns:
            ``key -> array`` for every key of ``wanted``.
        """
        raise NotImplementedError

    def saved_shardings(self) -> Mapping[str, Any] | None:
        """Return ``key -> SavedSharding | None`` as recorded at save time, or ``None``.

        ``None`` (the default) means the format does not record shardings, so
        ``load(mesh=)`` refuses it; a ``None`` entry means that array was not
        sharded (NumPy, or one device) and is replicated on the mesh.
        """
        return None

    def verify(self, table: ArrayTable) -> list[str] | None:
        """Check every stored array against its checksum; one message per bad array.

        ``jaxstruct inspect --verify`` uses it. The default (``None``: this format
        stores no checksums) makes ``--verify`` read the arrays one at a time and
        report that no checksums were checked.
        """
        return None

    def verify_by_reading(self, table: ArrayTable) -> list[str]:
        """Read every array of ``table`` as NumPy, one at a time; one message per array
        whose read fails.

        The :meth:`verify` of a format whose every read checks the stored checksums
        is this: ``def verify(self, table): return self.verify_by_reading(table)``.
        """
        problems: list[str] = []
        for key in table:
            try:
                self.read_arrays(table, {key: None})
            except SerializationError as err:
                problems.append(str(err))
        return problems

    def check_members(self, table: ArrayTable) -> None:
        """Raise ``SerializationError`` unless the checkpoint holds exactly the arrays of
        ``table`` (names, and shapes and dtypes or sizes), reading none of their data.

        Export calls it on what :meth:`Format.write` made before that replaces a
        previous checkpoint. The default checks nothing.
        """

    def close(self) -> None:
        """Release the files."""


class PendingWrite:
    """A background write started by :meth:`Format.write_async`."""

    def wait(self) -> None:
        """Block until the write is committed; raise its error if it failed."""
        raise NotImplementedError

    def done(self) -> bool:
        """Return whether the write has finished (successfully or not)."""
        raise NotImplementedError


class Format:
    """Base class of on-disk formats; subclass it in a plugin and return an instance from
    ``jaxstruct_register_formats``.

    Attributes:
        name: unique name, recorded in the manifest's ``container`` entry.
        suffixes: path suffixes that select this format on export (``(".zip",)``).
        is_directory: whether a checkpoint of this format is a directory.
        remote_paths: whether URL-like paths (``gs://bucket/ck``) are accepted; a
            format without it only ever sees local paths.
        publishes_atomically: whether :meth:`write` commits the checkpoint
            atomically itself; otherwise :func:`jaxstruct.io.export` hands it a
            fresh temporary sibling and publishes it with an atomic rename.
        multiprocess: whether :meth:`write` and :meth:`open` are called in every
            process of a multi-process run (collectively); otherwise only the
            primary process writes, and arrays it does not hold are refused.
        also_reads: other formats' names a manifest of this format's checkpoints
            may record as its ``container`` (a directory checkpoint zipped by hand
            is a zip checkpoint); default none.
        checks_arrays: whether this format stores a checksum of every stored byte
            of every array and checks it on every read (whole, ``select=``,
            sharded), so that jaxstruct computes and checks none of its own for
            it. Its opened checkpoints then say, file by file, whether the
            checksums are there (:attr:`OpenedCheckpoint.arrays_checked`).
            Default ``False``: jaxstruct checksums every array it hands to
            :meth:`write` and checks every array :meth:`OpenedCheckpoint.read_arrays`
            returns.

    Example:
        >>> import jaxstruct.io as jio
        >>> fmt = jio.current_registry().formats["zip"]
        >>> fmt.name, fmt.suffixes, isinstance(fmt, Format)
        ('zip', ('.zip',), True)
    """

    name: str = ""
    suffixes: tuple[str, ...] = ()
    is_directory: bool = False
    remote_paths: bool = False
    publishes_atomically: bool = False
    multiprocess: bool = False
    also_reads: tuple[str, ...] = ()
    checks_arrays: bool = False

    def write(
        self,
        target: Any,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        """Create ``target`` (which does not exist) holding ``manifest`` and ``arrays``, and
        write nothing anywhere else.

        ``arrays`` maps keys to ``numpy.ndarray`` or ``jax.Array`` values as the
        user holds them (possibly sharded): :func:`host_array` gives one host
        copy; a format for large models writes shard by shard
        (:func:`host_pieces`), never gathering a sharded array into one buffer.
        Never write into them. The keys are opaque; :func:`jaxstruct.io.array_paths`
        of ``manifest`` names each array by its tree path. Keep each array's
        memory order.

        ``compression`` is ``"auto"`` (the format decides; always accepted),
        ``"deflate"`` (compress the arrays) or ``"none"`` (store them as they
        are): honour what you can and refuse the rest with a
        ``SerializationError`` naming the value, before writing anything.

        Durability is jaxstruct's: ``export`` makes ``target`` durable
        (:func:`jaxstruct.io.make_durable`: every file and directory under it)
        after this returns, then renames it into place, so ``write`` fsyncs
        nothing (a format that :attr:`publishes_atomically` makes its own commit
        durable). Before
        publishing, ``export`` checks that ``target`` exists, is a directory
        exactly when :attr:`is_directory` says so, and is recognised by
        :meth:`sniff`; otherwise nothing is replaced and the export raises
        ``SerializationError`` naming this format. ``jaxstruct.testing.FormatTests``
        tests every promise of a format.
        """
        raise NotImplementedError

    def write_async(
        self,
        target: Any,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> PendingWrite | None:
        """Start writing in the background and return a handle, or ``None`` if unsupported.

        With ``None`` (the default), a non-blocking export runs :meth:`write`
        in a background thread on host copies of the arrays.
        """
        return None

    def sniff(self, path: Any) -> bool:
        """Return whether ``path`` (an existing file or directory) looks like this format.

        Judge by content, not by name: ``export`` asks it about the temporary
        :meth:`write` created, whose name is not the user's. The default
        claims nothing, so a write-only format never captures a load.
        """
        return False

    def open(self, path: Any, limits: Limits) -> OpenedCheckpoint:
        """Open ``path`` for reading, enforcing ``limits`` before allocating."""
        raise NotImplementedError

    def owns(self, path: Any) -> bool:
        """Return whether the existing ``path`` is a jaxstruct checkpoint of this format:
        only those are replaced by ``export(..., overwrite=True)``.

        The default asks :meth:`sniff`, then :meth:`open` and reads the manifest's
        ``container`` (it must be :attr:`name` or in :attr:`also_reads`). Override
        it with a cheaper check that is as certain (a few bytes of the file).
        """
        if not self.sniff(path):
            return False
        opened = self.open(path, DEFAULT_LIMITS)
        try:
            manifest = opened.manifest
        finally:
            opened.close()
        if manifest is None:
            return False
        return parse_manifest(manifest, repr(str(path)))["container"] in (
            self.name,
            *self.also_reads,
        )

    def remote_directory(self) -> Any:
        """Return a :class:`RemoteDirectory` for a ``CheckpointManager`` at a URL, or ``None``.

        Only formats with ``remote_paths`` provide one; the default (``None``)
        keeps the manager to local paths.
        """
        return None
