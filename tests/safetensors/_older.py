"""Files as an earlier jaxstruct-safetensors wrote them: a manifest of format version 1 (no
seal, no checksums section) and no checksums or marks in the metadata."""

from __future__ import annotations

import json
from typing import Any

from jaxstruct.safetensors._checksums import CHECKSUMS_KEY, MARK_KEY

MANIFEST_KEY = "jaxstruct.manifest"


def version_1(manifest: str) -> str:
    """A manifest as jaxstruct wrote it before format version 2."""
    top = json.loads(manifest)
    top.pop("seal")
    top.pop("checksums")
    top["version"] = 1
    return json.dumps(top, separators=(",", ":"))


def older(metadata: dict[str, Any]) -> None:
    """Edit a file's metadata in place into what jaxstruct-safetensors wrote before checksums."""
    metadata.pop(CHECKSUMS_KEY)
    metadata.pop(MARK_KEY)
    metadata[MANIFEST_KEY] = version_1(metadata[MANIFEST_KEY])
