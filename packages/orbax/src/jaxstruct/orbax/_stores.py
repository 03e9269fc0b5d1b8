"""Object stores (``gs://``, ``s3://``) for the orbax format: which URLs, and how to reach them.

Two libraries touch a checkpoint in a bucket: orbax's path layer
(``etils.epath``, through fsspec's gcsfs or s3fs) writes the small files and
lists directories, and tensorstore writes the arrays. Both read the variables
every Google and AWS client reads (``STORAGE_EMULATOR_HOST``;
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``), except that tensorstore's ``s3`` driver takes the endpoint and
region in its spec, which :func:`s3_kvstore` builds from the same variables.

Object stores have no atomic rename: a checkpoint there is committed by
orbax's commit marker (``commit_success.txt``, written last), never by
renaming a temporary directory (:func:`atomicity`).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from jaxstruct.registry import SerializationError

from ._orbax_internals import route_s3

__all__ = [
    "COMMIT_MARKER",
    "atomicity",
    "check_url",
    "committed",
    "is_store_url",
    "s3_kvstore",
    "scheme",
    "to_path",
]

#: The object orbax writes last into a checkpoint in an object store.
COMMIT_MARKER = "commit_success.txt"

# scheme -> (the fsspec implementation orbax's path layer needs, the extra installing it)
_PATH_LAYERS = {"gs": ("gcsfs", "gcs"), "s3": ("s3fs", "s3")}


def scheme(url: str) -> str:
    """The lower-cased scheme of ``url`` (``""`` for a local path)."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep else ""


def is_store_url(path: Any) -> bool:
    """Whether ``path`` is a URL of an object store this format writes to."""
    return isinstance(path, str) and scheme(path) in _PATH_LAYERS


def check_url(url: str) -> None:
    """Refuse a URL the format cannot store to, or one whose path layer is not installed."""
    kind = scheme(url)
    if kind not in _PATH_LAYERS:
        raise SerializationError(
            f"{url!r}: the orbax format stores checkpoints on local (or mounted) paths and "
            f"in object stores (gs://, s3://) only, not at {kind}:// URLs"
        )
    module, extra = _PATH_LAYERS[kind]
    if importlib.util.find_spec(module) is None:
        raise SerializationError(
            f"{url!r}: {kind}:// paths need {module}, which orbax's path layer uses; "
            f'pip install "jaxstruct-orbax[{extra}]"'
        )


def to_path(path: Any) -> Any:
    """``path`` as orbax's path type; a URL orbax cannot store to is refused first."""
    from etils import epath

    if isinstance(path, str):
        check_url(path)
        if scheme(path) == "s3":
            route_s3(s3_kvstore)
    return epath.Path(path)


def atomicity(target: Any) -> Any:
    """Orbax's atomicity options for ``target``: in an object store a commit marker written
    last, never a rename; elsewhere (``None``) orbax's default, a temporary and a rename."""
    if not is_store_url(str(target)):
        return None
    import orbax.checkpoint as ocp

    return ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)


def committed(p: Any) -> bool:
    """Orbax's own test: in an object store (no atomic rename), whether the commit
    marker it writes last exists; on a file system, that this is no temporary path."""
    import orbax.checkpoint as ocp

    try:
        return bool(ocp.path.step.is_path_finalized(p, atomicity_options=atomicity(p)))
    except AttributeError:  # an orbax-checkpoint that moved it: its marker's name
        return not is_store_url(str(p)) or (p / COMMIT_MARKER).exists()
    except OSError:
        return False


def s3_kvstore(bucket: str, path: str) -> dict[str, Any]:
    """Tensorstore's ``s3`` kvstore spec for ``s3://bucket/path``, configured from the
    environment: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (an S3-compatible
    server), ``AWS_REGION`` or ``AWS_DEFAULT_REGION``, and, when
    ``AWS_ACCESS_KEY_ID`` is set, the credentials in the environment only (no other
    provider of the default chain is asked)."""
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": path}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        spec["endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        spec["aws_credentials"] = {"type": "environment"}
    return spec
