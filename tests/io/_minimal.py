"""The docs' minimum plugin format (write, sniff, open, read_arrays; no checksums of its
own, no check_members), shared by the tests of jaxstruct's own checksums."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np

MAGIC = b"MINI0001"


class Minimal(jio.Format):
    """A file format from the docs' minimum: a magic, the manifest's length, the manifest,
    then each array's raw bytes in the manifest's order. No checksums of its own."""

    name = "minimal"
    suffixes = (".mini",)
    forget_arrays = False

    def write(self, target: Any, manifest: bytes, arrays: Any, **_: Any) -> None:
        with open(target, "wb") as out:
            out.write(MAGIC + len(manifest).to_bytes(8, "little") + manifest)
            if not self.forget_arrays:
                for key in sorted(arrays):
                    out.write(np.ascontiguousarray(jio.host_array(arrays[key])).tobytes())

    def sniff(self, path: Any) -> bool:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC

    def open(self, path: Any, limits: jio.Limits) -> jio.OpenedCheckpoint:
        return MinimalOpened(Path(path))


class MinimalOpened(jio.OpenedCheckpoint):
    def __init__(self, path: Path) -> None:
        self.data = path.read_bytes()
        size = int.from_bytes(self.data[8:16], "little")
        self.manifest = self.data[16 : 16 + size]
        self.start = 16 + size

    def read_arrays(self, table: Any, wanted: Any) -> dict[str, Any]:
        offset, out = self.start, {}
        for key in sorted(table):
            spec = table[key]
            if key in wanted:
                raw = self.data[offset : offset + spec.nbytes]
                host = jio.empty_array(spec)
                host.reshape(-1).view(np.uint8)[: len(raw)] = np.frombuffer(raw, np.uint8)
                out[key] = jio.place(host, wanted[key])
            offset += spec.nbytes
        return out
