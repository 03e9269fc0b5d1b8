"""The built-in formats: a directory and a zip archive of ``manifest.json`` and ``arrays.npz``."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxstruct.registry import SerializationError
from zlib_ng.zlib_ng import crc32

from . import _zip
from ._formats import Format, identity, stat_identity
from ._npz import NpzCheckpoint, read_member
from ._npz import members as npz_members
from ._schema import DEFAULT_LIMITS, Limits, check_node_budget, parse_manifest
from ._zip import ARRAYS, MANIFEST

_NOATIME = getattr(os, "O_NOATIME", 0)  # Linux only
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_noatime(path: Path, flags: int, dir_fd: int | None = None) -> int:
    """``os.open`` without updating the access time where the owner may ask for that."""
    name: Path | str = path if dir_fd is None else path.name
    if _NOATIME:
        try:
            return os.open(name, flags | _NOATIME, dir_fd=dir_fd)
        except PermissionError:  # O_NOATIME needs the file's owner (or CAP_FOWNER)
            pass
    return os.open(name, flags, dir_fd=dir_fd)


def open_regular(path: Path, *, follow: bool, dir_fd: int | None = None) -> tuple[int, int]:
    """Open ``path`` for reading and return ``(fd, size)``; only regular files are accepted."""
    flags = _READ_FLAGS if follow else _READ_FLAGS | os.O_NOFOLLOW
    try:
        fd = open_noatime(path, flags, dir_fd)
    except FileNotFoundError:
        raise FileNotFoundError(f"{str(path)!r}: no such file") from None
    except OSError as err:
        if not follow and os.path.islink(path):
            raise SerializationError(
                f"{str(path)!r}: is a symbolic link; only regular files are read"
            ) from None
        raise SerializationError(f"{str(path)!r}: cannot be opened ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SerializationError(
                f"{str(path)!r}: is not a regular file; only regular files are read"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def read_all(fd: int, size: int, where: str) -> bytes:
    """Read exactly ``size`` bytes from the start of ``fd``."""
    chunks: list[bytes] = []
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(size - pos, 1 << 24), pos)
        if not chunk:
            raise SerializationError(f"{where}: file shrank while being read")
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


def _manifest_too_big(where: str, size: int, limits: Limits) -> SerializationError:
    return SerializationError(
        f"{where}: manifest.json is {size} bytes, more than max_manifest_bytes="
        f"{limits.max_manifest_bytes}; if you trust this file, pass a larger "
        "max_manifest_bytes="
    )


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")

# A directory checkpoint's manifest.json ends with its own CRC-32, as one more member
# of its JSON object: ``,"checksum":"crc32:<8 hex digits>"}``, the CRC of every byte
# before the comma. (A .zip's manifest member has the zip's CRC.) The directory stays
# the specification's two files, readable by any JSON reader, and reading it costs
# no system call more. A manifest without it (written before, or unzipped from a .zip
# checkpoint) is read as it is.
_CHECKSUM_TAIL = re.compile(rb',\s*"checksum"\s*:\s*"crc32:([0-9a-f]{8})"\s*\}\s*\Z')
_TAIL_ROOM = 64  # the tail is 36 bytes as written; room for whitespace


def _with_checksum(manifest: bytes) -> bytes:
    """``manifest`` (a JSON object) with its CRC-32 as its last member."""
    head = manifest.rstrip()[:-1]  # without the closing brace
    return b'%s,"checksum":"crc32:%08x"}\n' % (head, crc32(head))


def _checked_manifest(data: bytes, where: str, *, check: bool = True) -> bytes:
    """The manifest of ``manifest.json``'s bytes, its checksum checked and taken off."""
    start = max(0, len(data) - _TAIL_ROOM)
    found = _CHECKSUM_TAIL.search(data, start)
    if found is None:
        return data
    end = found.start()
    if check:
        stored, computed = int(found.group(1), 16), crc32(memoryview(data)[:end])
        if stored != computed:
            raise SerializationError(
                f"{where}: manifest.json does not match its checksum (stored crc32 "
                f"{stored:08x}, computed {computed:08x}): it was changed or damaged after it "
                "was written; restore the checkpoint from a copy (after editing it on purpose, "
                'delete its last member, "checksum")'
            )
    return data[:end] + b"}\n"  # as written (one copy: a big manifest's costs more than its CRC)


#: The manifests this process wrote, by identity (device, inode, size, modification
#: and change times in ns): ``owns`` knows those without reading them again. An edited
#: or replaced file has another identity and is read; a forked child inherits the set,
#: which stays true there.
_WRITTEN: set[tuple[int, ...]] = set()
_WRITTEN_MAX = 1024


def _create(path: Path) -> Any:
    return open(path, "xb", buffering=0)


def _open_pair(path: Path) -> tuple[int, int, int, int]:
    """Open the manifest and the arrays of the checkpoint directory ``path`` (``-1``: missing)."""
    for attempt in range(3):
        try:
            dirfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise FileNotFoundError(f"{str(path)!r}: no such directory") from None
        except OSError as err:
            raise SerializationError(f"{str(path)!r}: cannot be opened ({err.strerror})") from None
        fd = size = -1
        try:
            fd, size = open_regular(path / MANIFEST, follow=False, dir_fd=dirfd)
            arrays_fd, arrays_size = open_regular(path / ARRAYS, follow=False, dir_fd=dirfd)
            return fd, size, arrays_fd, arrays_size
        except FileNotFoundError:
            if attempt < 2 and _replaced(dirfd, path):
                if fd >= 0:
                    os.close(fd)
                continue
            if fd < 0:
                raise
            return fd, size, -1, -1
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        finally:
            os.close(dirfd)
    raise AssertionError("unreachable")  # pragma: no cover


def _replaced(dirfd: int, path: Path) -> bool:
    """Whether ``path`` now names another directory than the one open as ``dirfd``."""
    now = identity(path)
    return now is not None and now != stat_identity(os.fstat(dirfd))


class DirectoryFormat(Format):
    """A directory holding ``manifest.json`` and ``arrays.npz``."""

    name = "directory"
    suffixes = ()
    is_directory = True
    also_reads = ("zip",)  # an unzipped .zip checkpoint is a directory checkpoint
    checks_arrays = True  # every member's CRC-32, checked on every read

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        target.mkdir()
        step("temp-created")
        with _create(target / ARRAYS) as npz:
            _zip.write_zip(npz, npz_members(arrays), compression=compression, after_member=step)
        step("arrays-written")
        with _create(target / MANIFEST) as man:
            man.write(_with_checksum(manifest))
            if len(_WRITTEN) >= _WRITTEN_MAX:
                _WRITTEN.clear()
            _WRITTEN.add(stat_identity(os.fstat(man.fileno())))
        step("manifest-written")

    def sniff(self, path: Path) -> bool:
        # A manifest.json found inside makes ``path`` a directory (or a link to one).
        return os.path.exists(os.path.join(path, MANIFEST))

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is a checkpoint of this format (which ``overwrite`` replaces)."""
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
            if identity(path / MANIFEST, follow=False) in _WRITTEN:
                return True  # as this process wrote it
            fd, size = open_regular(path / MANIFEST, follow=False)
        except (OSError, SerializationError):
            return False
        try:
            if size > DEFAULT_LIMITS.max_manifest_bytes:
                return False
            data = read_all(fd, size, repr(str(path)))
            # Whether it is ours, not whether it is sound: a damaged checkpoint may be replaced.
            return _is_our_manifest(_checked_manifest(data, MANIFEST, check=False), self)
        except (OSError, SerializationError):
            return False
        finally:
            os.close(fd)

    def open(self, path: Path, limits: Limits) -> NpzCheckpoint:
        where = repr(str(path))
        fd, size, arrays_fd, arrays_size = _open_pair(path)
        try:
            if size > limits.max_manifest_bytes:
                raise _manifest_too_big(where, size, limits)
            raw = read_all(fd, size, where)
            manifest = _checked_manifest(raw, where)
            check_node_budget(manifest, where, limits.max_nodes)
            if arrays_fd < 0:
                raise SerializationError(f"{where}: arrays.npz is missing")
        except BaseException:
            if arrays_fd >= 0:
                os.close(arrays_fd)
            raise
        finally:
            os.close(fd)
        where = f"{where} (arrays.npz)"
        try:
            index = _zip.read_index(
                arrays_fd, arrays_size, where, max_ratio=limits.max_inflation_ratio
            )
        except BaseException:
            os.close(arrays_fd)
            raise
        opened = NpzCheckpoint(arrays_fd, index, where, manifest, frozenset())
        if len(manifest) == len(raw):  # no checksum was taken off
            opened.checksum_scheme = _UNCHECKED_MANIFEST
        return opened


#: The directory checkpoints whose manifest.json carries no CRC-32 of its own.
_UNCHECKED_MANIFEST = (
    "CRC-32 of every array member; manifest.json has none (written before manifests "
    "carried one, or unzipped from a .zip)"
)


class ZipFormat(Format):
    """One zip archive holding ``manifest.json`` and ``arrays.npz`` (stored)."""

    name = "zip"
    suffixes = (".zip",)
    is_directory = False
    also_reads = ("directory",)  # a zipped directory checkpoint is a zip checkpoint
    checks_arrays = True  # every member's CRC-32, checked on every read

    def write(
        self,
        target: Path,
        manifest: bytes,
        arrays: Mapping[str, Any],
        *,
        compression: str,
        step: Callable[[str], None],
    ) -> None:
        members = npz_members(arrays)  # refuse what cannot be written before creating anything
        with _create(target) as handle:
            _zip.write_outer(handle, manifest, members, compression=compression, after_member=step)
        step("arrays-written")

    def sniff(self, path: Path) -> bool:
        if not path.is_file():
            return False
        fd = open_noatime(path, os.O_RDONLY)
        try:
            return os.pread(fd, 4, 0) in _ZIP_MAGIC
        finally:
            os.close(fd)

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is a checkpoint of this format (which ``overwrite`` replaces)."""
        try:  # a symbolic link is the user's, never replaced (as for a directory)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return False
            fd, size = open_regular(path, follow=False)
        except (OSError, SerializationError):
            return False
        where = repr(str(path))
        limits = DEFAULT_LIMITS
        try:
            if os.pread(fd, 4, 0) not in _ZIP_MAGIC:
                return False
            index = _zip.read_index(fd, size, where, max_ratio=limits.max_inflation_ratio)
            entry = index.entries.get(MANIFEST)
            if entry is None or entry.size > limits.max_manifest_bytes:
                return False
            return _is_our_manifest(read_member(fd, entry, where, index), self)
        except (OSError, SerializationError):
            return False
        finally:
            os.close(fd)

    def open(self, path: Path, limits: Limits) -> NpzCheckpoint:
        where = repr(str(path))
        fd, size = open_regular(path, follow=True)
        try:
            outer = _zip.read_index(fd, size, where, max_ratio=limits.max_inflation_ratio)
            entry = outer.entries.get(MANIFEST)
            if entry is None:
                raise SerializationError(f"{where}: the archive has no manifest.json")
            if entry.size > limits.max_manifest_bytes:
                raise _manifest_too_big(where, entry.size, limits)
            manifest = read_member(fd, entry, where, outer)
            check_node_budget(manifest, where, limits.max_nodes)
            npz = outer.entries.get(ARRAYS)
            if npz is None:  # the first release's layout: .npy members beside the manifest
                return NpzCheckpoint(fd, outer, where, manifest, frozenset({MANIFEST}))
            if set(outer.entries) != {MANIFEST, ARRAYS}:
                raise SerializationError(
                    f"{where}: the archive must hold exactly manifest.json and arrays.npz, "
                    f"not {sorted(outer.entries)[:6]}"
                )
            if npz.method != 0:
                raise SerializationError(
                    f"{where}: arrays.npz is compressed inside the archive; it must be stored "
                    "(zip it again without compression, e.g. zip -0)"
                )
            inner = _zip.read_index(
                fd,
                npz.size,
                f"{where} (arrays.npz)",
                max_ratio=limits.max_inflation_ratio,
                base=npz.data_offset,
                data=outer.cached(npz.data_offset, npz.size),
            )
        except BaseException:
            os.close(fd)
            raise
        return NpzCheckpoint(
            fd, inner, f"{where} (arrays.npz)", manifest, frozenset(), container=npz
        )


def _is_our_manifest(data: bytes, fmt: Format) -> bool:
    """Whether ``data`` parses as a jaxstruct manifest written for ``fmt``'s container."""
    try:
        top = parse_manifest(data, MANIFEST, check_seal=False)  # a damaged one is ours too
    except SerializationError:
        return False
    return top["container"] in (fmt.name, *fmt.also_reads)
