"""Tests that edit a checkpoint's JSON items on purpose seal them again with these CRCs."""

from __future__ import annotations

import json
from pathlib import Path

import jaxstruct.io as jio
from jaxstruct.orbax._units import json_crc as _crc


def reseal(path: Path) -> None:
    """Seal the (edited) manifest anew (jaxstruct's seal) and record the CRCs of the manifest
    and storage items of the checkpoint ``path``."""
    storage = path / "jaxstruct_storage" / "metadata"
    document = json.loads(storage.read_text())
    item = path / "jaxstruct" / "metadata"
    manifest = json.loads(item.read_text())
    if manifest.get("version") != 1:
        manifest = json.loads(jio.seal_manifest(manifest))
        item.write_text(json.dumps(manifest))
    document["manifest_crc32"] = _crc(manifest)
    document["crc32"] = _crc(document)
    storage.write_text(json.dumps(document))


def manifest_version_1(path: Path) -> None:
    """Make the manifest item of the checkpoint ``path`` one of format version 1, as
    jaxstruct-orbax wrote before jaxstruct's seal and checksums section."""
    item = path / "jaxstruct" / "metadata"
    manifest = json.loads(item.read_text())
    manifest.pop("seal")
    manifest.pop("checksums")
    manifest["version"] = 1
    item.write_text(json.dumps(manifest))
