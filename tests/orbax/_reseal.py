"""Tests that edit a checkpoint's JSON items on purpose seal them again with these CRCs."""

from __future__ import annotations

import json
from pathlib import Path

from jaxstruct.orbax._units import json_crc as _crc


def reseal(path: Path) -> None:
    """Record the CRCs of the (edited) manifest and storage items of the checkpoint ``path``."""
    storage = path / "jaxstruct_storage" / "metadata"
    document = json.loads(storage.read_text())
    manifest = json.loads((path / "jaxstruct" / "metadata").read_text())
    document["manifest_crc32"] = _crc(manifest)
    document["crc32"] = _crc(document)
    storage.write_text(json.dumps(document))
