"""Object stores (``gs://``, ``s3://``) for the orbax format: which URLs, and how to reach them.

Two libraries touch a checkpoint in a bucket: orbax's path layer
(``etils.epath``, through fsspec's gcsfs or s3fs) writes the small files and
lists directories, and tensorstore writes the arrays. Each reads its own
variables (gcsfs ``STORAGE_EMULATOR_HOST``, tensorstore's ``gcs`` driver
``TENSORSTORE_GCS_HTTP_URL``; s3fs ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), except that tensorstore's ``s3``
driver takes an endpoint only in its spec: :func:`s3_kvstore` puts the
``AWS_*`` endpoint and region there.

Object stores have no atomic rename: a checkpoint there is committed by
orbax's commit marker (``commit_success.txt``, written last), never by
renaming a temporary directory (:func:`temporary_path_class`).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from jaxstruct.registry import SerializationError

from ._orbax_internals import route_s3

__all__ = [
    "COMMIT_MARKER",
    "check_url",
    "committed",
    "configure_s3",
    "is_store_url",
    "s3_kvstore",
    "scheme",
    "temporary_path_class",
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


def temporary_path_class(target: Any) -> Any:
    """How orbax commits a save at ``target``: in an object store, its commit marker written
    last (``CommitFileTemporaryPath``), never a rename; elsewhere (``None``) its default, a
    temporary directory renamed into place. Every orbax-checkpoint 0.12 takes this class
    (``AtomicityOptions`` came later in 0.12)."""
    if not is_store_url(str(target)):
        return None
    import orbax.checkpoint as ocp

    return ocp.path.atomicity.CommitFileTemporaryPath


def committed(p: Any) -> bool:
    """Orbax's own test: in an object store (no atomic rename), whether the commit
    marker it writes last exists; on a file system, that this is no temporary path."""
    import orbax.checkpoint as ocp

    try:
        finalized = ocp.path.step.is_path_finalized
        return bool(finalized(p, temporary_path_cls=temporary_path_class(p)))
    except AttributeError:  # an orbax-checkpoint that moved it: its marker's name
        return not is_store_url(str(p)) or (p / COMMIT_MARKER).exists()
    except OSError:
        return False


@dataclass(frozen=True)
class _S3Settings:
    endpoint: str | None
    region: str | None
    credentials: dict[str, str] | None  # tensorstore's aws_credentials


_s3: _S3Settings | None = None  # set by configure_s3; None: the AWS_* variables


def configure_s3(
    *,
    endpoint: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    session_token: str | None = None,
) -> None:
    """Reach every ``s3://`` URL of this process with these settings instead of ``AWS_*``.

    Both layers that touch a checkpoint in S3 get them: tensorstore's ``s3``
    driver (the arrays) in its spec, and s3fs (orbax's path layer) through
    fsspec's configuration for ``s3``, which is per process (orbax opens paths
    by URL alone), so the settings are too. ``os.environ`` is not changed.
    Tensorstore takes keys only from the environment or a credentials file:
    given keys are written to a file only this user can read, in a new
    temporary directory removed when the process exits. A setting left
    ``None`` falls back to its ``AWS_*`` variable; ``configure_s3()`` with
    none goes back to the variables alone.

    Args:
        endpoint: an S3-compatible server (``"http://127.0.0.1:9000"``).
        region: the region requests are signed for (``"us-east-1"``).
        access_key_id: with ``secret_access_key`` (and ``session_token`` for
            temporary credentials), the keys requests are signed with.
        secret_access_key: see ``access_key_id``.
        session_token: see ``access_key_id``.

    Raises:
        SerializationError: only one of ``access_key_id`` and ``secret_access_key``
            is given, or ``endpoint`` is not an http(s) URL.

    Example:
        >>> from jaxstruct.orbax import configure_s3
        >>> configure_s3(endpoint="http://127.0.0.1:9000", region="us-east-1")
        >>> configure_s3()  # back to the AWS_* variables
    """
    global _s3
    if (access_key_id is None) != (secret_access_key is None):
        raise SerializationError(
            "configure_s3() needs access_key_id and secret_access_key together (or neither, "
            "for the keys of the AWS_* variables)"
        )
    if endpoint is not None and scheme(endpoint) not in ("http", "https"):
        raise SerializationError(
            f"configure_s3(endpoint={endpoint!r}) must be an http:// or https:// URL"
        )
    credentials = None
    options: dict[str, Any] = {}
    if endpoint is not None:
        options["endpoint_url"] = endpoint
    if region is not None:
        options["client_kwargs"] = {"region_name": region}
    if access_key_id is not None and secret_access_key is not None:
        options.update(key=access_key_id, secret=secret_access_key)
        if session_token is not None:
            options["token"] = session_token
        credentials = _credentials_file(access_key_id, secret_access_key, session_token)
    import fsspec.config

    if options:
        fsspec.config.conf["s3"] = options
    else:
        fsspec.config.conf.pop("s3", None)
    _forget_path_layer()
    _s3 = _S3Settings(endpoint, region, credentials) if options else None


def _credentials_file(key: str, secret: str, token: str | None) -> dict[str, str]:
    """Tensorstore's ``aws_credentials`` for these keys: a profile in a private file."""
    folder = tempfile.mkdtemp(prefix="jaxstruct-s3-")  # mode 0700: this user only
    atexit.register(_remove_in, os.getpid(), folder)
    lines = ["[jaxstruct]", f"aws_access_key_id = {key}", f"aws_secret_access_key = {secret}"]
    if token is not None:
        lines.append(f"aws_session_token = {token}")
    files = {"credentials_file": "\n".join(lines) + "\n", "config_file": ""}
    out = {"type": "profile", "profile": "jaxstruct"}
    for name, text in files.items():
        path = os.path.join(folder, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        out[name] = path
    return out


def _remove_in(owner: int, folder: str) -> None:
    """Remove ``folder`` at exit of the process that made it (a forked child that exits
    normally runs its parent's at-exit hooks too, and must not take the parent's keys)."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _forget_path_layer() -> None:
    """Make orbax's path layer open its s3 file system anew (with fsspec's new settings)."""
    try:
        from etils.epath import backend
    except ImportError:  # pragma: no cover - a dependency of orbax-checkpoint
        return
    cached: Any = getattr(getattr(backend, "fsspec_backend", None), "_get_filesystem", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


def s3_kvstore(bucket: str, path: str) -> dict[str, Any]:
    """Tensorstore's ``s3`` kvstore spec for ``s3://bucket/path``: the settings of
    :func:`configure_s3`, else the environment's: ``AWS_ENDPOINT_URL_S3`` or
    ``AWS_ENDPOINT_URL`` (an S3-compatible server), ``AWS_REGION`` or
    ``AWS_DEFAULT_REGION``, and, when ``AWS_ACCESS_KEY_ID`` is set, the credentials in
    the environment only (no other provider of the default chain is asked)."""
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": path}
    given = _s3 or _S3Settings(None, None, None)
    endpoint = (
        given.endpoint
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    if endpoint:
        spec["endpoint"] = endpoint
    region = given.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    if given.credentials is not None:
        spec["aws_credentials"] = dict(given.credentials)
    elif os.environ.get("AWS_ACCESS_KEY_ID"):
        spec["aws_credentials"] = {"type": "environment"}
    return spec
