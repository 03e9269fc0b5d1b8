"""``gs://`` settings given in code (:func:`configure_gcs`), for both layers that touch a bucket.

gcsfs (orbax's path layer) gets them through fsspec's configuration for
``gs``; tensorstore's ``gcs`` driver, whose spec has no endpoint, through its
``tensorstore_gcs_http_url`` flag, and the project billed in the spec orbax
builds (:func:`gcs_store`). Neither changes ``os.environ``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from jaxstruct.registry import SerializationError

from ._orbax_internals import route_stores
from ._stores import _forget_path_layer, scheme

__all__ = ["configure_gcs", "gcs_store"]

# fsspec's names for gcsfs's file system (etils.epath asks for "gcs", users for "gs").
_PROTOCOLS = ("gs", "gcs")
_FLAG = "tensorstore_gcs_http_url"


@dataclass(frozen=True)
class _Before:
    """What the first :func:`configure_gcs` replaced, put back by ``configure_gcs()``."""

    options: dict[str, dict[str, Any]]  # fsspec's configuration for each protocol
    implementation: type  # the file system class fsspec gave for gs://


_before: _Before | None = None
_user_project: str | None = None  # set by configure_gcs


def configure_gcs(
    *,
    endpoint: str | None = None,
    token: str | None = None,
    project: str | None = None,
    user_project: str | None = None,
) -> None:
    """Reach every ``gs://`` URL of this process with these settings.

    The settings hold for the whole process (orbax opens paths by URL alone),
    and ``os.environ`` is not changed. ``configure_gcs()`` with none goes
    back to what the environment says (``STORAGE_EMULATOR_HOST``,
    ``TENSORSTORE_GCS_HTTP_URL``, Application Default Credentials). Call it
    before the first ``gs://`` access: a store tensorstore has already opened
    keeps its endpoint. With many processes, every process calls it.

    Args:
        endpoint: a GCS-compatible server (``"http://127.0.0.1:4443"``, such as
            fake-gcs-server), for both gcsfs and tensorstore. gcsfs then uses its
            plain HTTP file system: its experimental one for zonal and
            hierarchical-namespace buckets asks Google's Storage Control API
            (gRPC, at the endpoint's host) about each bucket, which such a
            server does not serve.
        token: ``"anon"``: gcsfs sends no credentials. Tensorstore's ``gcs``
            driver has no such setting: it sends what its own credential search
            finds (``GOOGLE_AUTH_TOKEN_FOR_TESTING``,
            ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's default credentials
            file, the GCE metadata server), once per process, and nothing when
            it finds none. ``None``: both search for credentials.
        project: the project gcsfs lists and creates buckets in (tensorstore
            does neither).
        user_project: the project billed for requests to a Requester Pays
            bucket, for both: gcsfs's ``requester_pays``, and tensorstore's
            ``gcs_user_project`` in the spec of every ``gs://`` store orbax opens.

    Raises:
        SerializationError: ``endpoint`` is not an http(s) URL; ``token`` is
            neither ``None`` nor ``"anon"`` (a service account key file is given
            as ``GOOGLE_APPLICATION_CREDENTIALS``, the only place tensorstore
            reads one); gcsfs is not installed.

    Example:
        >>> from jaxstruct.orbax import configure_gcs
        >>> configure_gcs(endpoint="http://127.0.0.1:4443", token="anon")
        >>> configure_gcs()  # back to the environment
    """
    _check(endpoint, token)
    import fsspec
    import fsspec.config

    global _before, _user_project
    if _before is None:
        saved = {name: dict(fsspec.config.conf.get(name, {})) for name in _PROTOCOLS}
        _before = _Before(saved, fsspec.get_filesystem_class("gs"))
    options: dict[str, Any] = {}
    if endpoint is not None:
        options["endpoint_url"] = endpoint
    if token is not None:
        options["token"] = token
    if project is not None:
        options["project"] = project
    if user_project is not None:
        options["requester_pays"] = user_project
    implementation = _before.implementation
    if endpoint is not None:
        from gcsfs.core import GCSFileSystem

        implementation = GCSFileSystem
    for name in _PROTOCOLS:
        _restore(fsspec.config.conf, name, {**_before.options[name], **options})
        fsspec.register_implementation(name, implementation, clobber=True)
    _forget_path_layer()
    _tensorstore_endpoint(endpoint)
    _user_project = user_project
    route_stores("gs", gcs_store)


def gcs_store(store: dict[str, Any]) -> dict[str, Any]:
    """A ``gcs`` store of the spec orbax builds for a ``gs://`` directory, with the
    ``user_project`` of :func:`configure_gcs` (none given: ``store`` as orbax built it)."""
    if _user_project is None:
        return store
    return {**store, "gcs_user_project": {"project_id": _user_project}}


def _check(endpoint: str | None, token: str | None) -> None:
    """Refuse what configure_gcs cannot give both layers, before anything is changed."""
    if endpoint is not None and scheme(endpoint) not in ("http", "https"):
        raise SerializationError(
            f"configure_gcs(endpoint={endpoint!r}) must be an http:// or https:// URL"
        )
    if token not in (None, "anon"):
        raise SerializationError(
            f"configure_gcs(token={token!r}): token is None (each library finds "
            f'credentials itself) or "anon"; for a service account key file set '
            "GOOGLE_APPLICATION_CREDENTIALS to its path in the process's environment, "
            "the only place tensorstore (which writes the arrays) reads one"
        )
    if importlib.util.find_spec("gcsfs") is None:
        raise SerializationError(
            "configure_gcs() sets up gcsfs, which orbax's path layer uses for gs:// paths; "
            'pip install "jaxstruct-orbax[gcs]"'
        )


def _restore(conf: dict[str, Any], name: str, options: dict[str, Any]) -> None:
    """Set fsspec's configuration for protocol ``name`` to ``options`` (none: no entry)."""
    if options:
        conf[name] = dict(options)
    else:
        conf.pop(name, None)


def _tensorstore_endpoint(endpoint: str | None) -> None:
    """Point tensorstore's ``gcs`` driver at ``endpoint`` (``None``: its variable again)."""
    import tensorstore as ts

    parse = getattr(ts, "parse_tensorstore_flags", None)
    if parse is None:
        raise SerializationError(
            "this tensorstore has no parse_tensorstore_flags, through which configure_gcs() "
            "gives its gcs driver an endpoint; set TENSORSTORE_GCS_HTTP_URL instead"
        )
    # An empty value unsets the flag: tensorstore reads TENSORSTORE_GCS_HTTP_URL again.
    parse(["jaxstruct", f"--{_FLAG}={endpoint or ''}"])
