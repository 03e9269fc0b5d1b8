"""Checkpoints in an object store as a ``CheckpointManager`` and ``overwrite=True`` see them.

Everything goes through orbax's path layer (``etils.epath``). A checkpoint
counts only once orbax's commit marker, written last, exists; deleting one
removes that marker first, so a reader never takes a half-deleted checkpoint
for a whole one.

Replacing the checkpoint at ``url`` (``export(..., overwrite=True)``) cannot
rename, so the new one is written and committed at ``url`` + ``STAGED``
first; then the old one's marker is removed, its objects deleted, the new
one's objects copied to ``url`` (server-side copies) with its marker last,
and the staged copy removed. Loading ``url`` at any instant gives the old
checkpoint (until its marker goes) or the new one (the staged copy, until
``url``'s own marker is back). A replacement interrupted midway is finished
by the next one.
"""

from __future__ import annotations

from jaxstruct.io import RemoteDirectory
from jaxstruct.registry import SerializationError

from ._stores import COMMIT_MARKER, committed, to_path

__all__ = ["STAGED", "OrbaxRemote", "replacement"]

#: Suffix of the URL where the checkpoint replacing another one is written first.
STAGED = ".jaxstruct-replacing"


def replacement(url: str) -> str | None:
    """The committed replacement staged for ``url``, if a replacement is midway."""
    staged = url.rstrip("/") + STAGED
    return staged if committed(to_path(staged)) else None


class OrbaxRemote(RemoteDirectory):
    """Steps at a URL, through orbax's path layer; ``manifest``: where jaxstruct's manifest
    lies inside a checkpoint (a committed checkpoint without one is not ours)."""

    def __init__(self, manifest: str) -> None:
        self.manifest = manifest

    def names(self, url: str) -> list[str]:
        try:
            return [entry.name for entry in to_path(url).iterdir()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def committed(self, url: str) -> bool:
        p = to_path(url)
        return committed(p) and (p / self.manifest).exists()

    def read_text(self, url: str) -> str | None:
        try:
            return to_path(url).read_text()
        except FileNotFoundError:
            return None

    def write_text(self, url: str, text: str) -> None:
        to_path(url).write_text(text)

    def remove(self, url: str) -> None:
        try:
            to_path(url).unlink()
        except FileNotFoundError:
            pass

    def delete_checkpoint(self, url: str) -> None:
        p = to_path(url)
        self.remove(str(p / COMMIT_MARKER))  # unlisted (and unloadable) from here on
        if p.exists():
            p.rmtree()

    def stage_replacement(self, url: str) -> str:
        url = url.rstrip("/")
        staged = url + STAGED
        if replacement(url) is not None and not self.committed(url):
            self.commit_replacement(staged, url)  # the last replacement stopped midway
        elif self.names(staged):
            self.delete_checkpoint(staged)  # a replacement whose write never finished
        if not self.names(url):
            return url
        if not self.committed(url):
            raise SerializationError(
                f"{url!r} holds something other than a committed jaxstruct orbax checkpoint; "
                "overwrite=True only replaces checkpoints. Remove it yourself, or choose "
                "another path"
            )
        return staged

    def commit_replacement(self, staged: str, url: str) -> None:
        import fsspec

        fs, root = fsspec.core.url_to_fs(staged)  # the file system orbax's path layer uses
        self.delete_checkpoint(url)  # from here, loading url finds the staged one
        source, target = to_path(staged), to_path(url)
        root = root.rstrip("/")
        fs.invalidate_cache(root)  # tensorstore wrote the arrays past its listing cache
        names = [key[len(root) + 1 :] for key in fs.find(root)]
        for name in sorted(names, key=lambda name: name == COMMIT_MARKER):  # the marker last
            (source / name).copy(target / name, overwrite=True)
        self.delete_checkpoint(staged)
