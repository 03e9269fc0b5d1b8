"""How the orbax format reaches object stores, without a server: the extras named, the
tensorstore spec an s3:// directory gets, the settings it takes from the environment or
from configure_s3."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.orbax import _orbax_internals, _stores, configure_s3
from jaxstruct.registry import SerializationError

_AWS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in (*_AWS, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    configure_s3()


@pytest.mark.parametrize(("url", "extra"), [("s3://b/ck", "s3"), ("gs://b/ck", "gcs")])
def test_a_missing_path_layer_is_named_with_its_extra(
    url: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("s3fs", "gcsfs") else real(name, *a),
    )
    with pytest.raises(SerializationError, match=rf'pip install "jaxstruct-orbax\[{extra}\]"'):
        jio.export({"w": np.ones(2)}, url, format="orbax")


def test_an_s3_directory_gets_orbax_gcs_spec_with_s3_stores(no_aws: Any) -> None:
    """Orbax's own spec for the bucket in GCS (OCDBT, coalescing), each store made s3."""
    import inspect

    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    build = inspect.unwrap(tsu.build_kvstore_tspec)
    gcs = build("gs://bucket-x/run/arrays", name="w")
    s3 = _orbax_internals._to_s3(gcs, _stores.s3_kvstore)
    assert s3["driver"] == "ocdbt" and s3["base"] == {
        "driver": "s3",
        "bucket": "bucket-x",
        "path": "run/arrays",
    }
    rest = {k: v for k, v in s3.items() if k != "base"}
    assert rest == {k: v for k, v in gcs.items() if k != "base"}
    assert "experimental_read_coalescing_threshold_bytes" in s3  # orbax: a remote store
    assert _orbax_internals._to_s3("gs://bucket-x/a/b", _stores.s3_kvstore)["path"] == "a/b"


def test_the_s3_spec_takes_the_aws_variables(no_aws: Any) -> None:
    no_aws.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    no_aws.setenv("AWS_REGION", "eu-west-3")
    no_aws.setenv("AWS_ACCESS_KEY_ID", "k")
    assert _stores.s3_kvstore("b", "p") == {
        "driver": "s3",
        "bucket": "b",
        "path": "p",
        "endpoint": "http://127.0.0.1:9",
        "aws_region": "eu-west-3",
        "aws_credentials": {"type": "environment"},  # no other provider is asked
    }
    no_aws.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:10")  # the S3-only one wins
    assert _stores.s3_kvstore("b", "p")["endpoint"] == "http://127.0.0.1:10"


def test_configure_s3_reaches_both_layers_without_the_environment(no_aws: Any) -> None:
    import fsspec.config

    before = dict(os.environ)
    configure_s3(
        endpoint="http://127.0.0.1:9",
        region="us-east-1",
        access_key_id="id",
        secret_access_key="secret",
        session_token="token",
    )
    assert dict(os.environ) == before
    spec = _stores.s3_kvstore("b", "p")
    assert spec["endpoint"] == "http://127.0.0.1:9" and spec["aws_region"] == "us-east-1"
    creds = spec["aws_credentials"]
    assert creds["type"] == "profile" and creds["profile"] == "jaxstruct"
    with open(creds["credentials_file"]) as handle:
        text = handle.read()
    assert "aws_access_key_id = id" in text and "aws_session_token = token" in text
    assert stat.S_IMODE(os.stat(creds["credentials_file"]).st_mode) == 0o600
    assert fsspec.config.conf["s3"] == {
        "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"region_name": "us-east-1"},
        "key": "id",
        "secret": "secret",
        "token": "token",
    }
    configure_s3()
    assert "s3" not in fsspec.config.conf
    assert "endpoint" not in _stores.s3_kvstore("b", "p")


@pytest.fixture
def gcs_reset(monkeypatch: pytest.MonkeyPatch) -> Any:
    from google.auth.compute_engine import _metadata  # gcsfs's dependency
    from jaxstruct.orbax import configure_gcs

    # Without a token, gcsfs and google-auth look for a cloud machine's metadata server
    # (tries with back-off, 15 s here); these tests check our settings, not the machine's,
    # so both are told this is no cloud machine (google-auth reads it once, on import).
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)
    yield configure_gcs
    configure_gcs()


def _recording_server(seen: list[str]) -> Any:
    """An HTTP server on 127.0.0.1 that answers 404 to everything and notes each path."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_configure_gcs_reaches_gcsfs_through_orbax_path_layer(gcs_reset: Any) -> None:
    import fsspec.config
    import gcsfs.core
    from etils.epath import backend

    before = dict(os.environ)
    gcs_reset(endpoint="http://127.0.0.1:9", token="anon", project="proj")
    assert dict(os.environ) == before
    fs = backend.fsspec_backend.fs("gs://bucket-x/run")  # what orbax's path layer opens
    assert type(fs) is gcsfs.core.GCSFileSystem  # the plain HTTP one, no gRPC control API
    assert fs._location == "http://127.0.0.1:9" and fs.project == "proj"
    assert fs.credentials.token == "anon"
    for name in ("gs", "gcs"):
        assert fsspec.config.conf[name]["endpoint_url"] == "http://127.0.0.1:9"
    gcs_reset()
    assert "endpoint_url" not in fsspec.config.conf.get("gs", {})
    again = backend.fsspec_backend.fs("gs://bucket-x/run")
    assert again is not fs and again._endpoint is None


def test_configure_gcs_reaches_tensorstore_gcs_driver(
    gcs_reset: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensorstore's gcs driver asks the given endpoint; configure_gcs() gives it back to
    TENSORSTORE_GCS_HTTP_URL."""
    import tensorstore as ts

    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "throwaway")  # no credential search
    given, variable = [], []
    servers = [_recording_server(given), _recording_server(variable)]
    try:
        monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{servers[1].server_port}")

        def read() -> None:
            store = ts.KvStore.open({"driver": "gcs", "bucket": "bucket-x"}).result()
            assert store.read(b"k").result().state == "missing"

        before = dict(os.environ)
        gcs_reset(endpoint=f"http://127.0.0.1:{servers[0].server_port}")
        assert dict(os.environ) == before
        read()
        assert len(given) == 1 and variable == []
        assert given[0].startswith("/storage/v1/b/bucket-x/o/k?"), given
        gcs_reset()
        read()
        assert len(given) == 1 and len(variable) == 1
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"endpoint": "127.0.0.1:4443"}, "http:// or https://"),
        ({"token": "/keys/sa.json"}, "GOOGLE_APPLICATION_CREDENTIALS to its path"),
    ],
)
def test_configure_gcs_refuses_what_it_cannot_give_both_layers(
    gcs_reset: Any, kwargs: dict[str, str], match: str
) -> None:
    import fsspec.config

    conf = {name: dict(fsspec.config.conf.get(name, {})) for name in ("gs", "gcs")}
    with pytest.raises(SerializationError, match=match):
        gcs_reset(**kwargs)
    assert {name: dict(fsspec.config.conf.get(name, {})) for name in ("gs", "gcs")} == conf


def test_configure_gcs_user_project_reaches_both_layers(gcs_reset: Any) -> None:
    """The billed project: gcsfs's requester_pays, and tensorstore's gcs_user_project in the
    spec orbax builds for a gs:// directory (which orbax alone leaves without one)."""
    import tensorstore as ts
    from etils.epath import backend
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    gcs_reset(endpoint="http://127.0.0.1:9", token="anon", user_project="billed")
    assert backend.fsspec_backend.fs("gs://bucket-x/run").requester_pays == "billed"
    for kwargs in ({}, {"use_ocdbt": False}):
        spec = tsu.build_kvstore_tspec("gs://bucket-x/run/arrays", name="w", **kwargs)
        store = spec.get("base", spec)
        assert store["driver"] == "gcs" and store["bucket"] == "bucket-x", spec
        assert store["gcs_user_project"] == {"project_id": "billed"}, spec
        ts.KvStore.Spec(spec)  # tensorstore takes it
    assert tsu.build_kvstore_tspec("/tmp/run/arrays", name="w")["base"]["driver"] == "file"
    gcs_reset()
    spec = tsu.build_kvstore_tspec("gs://bucket-x/run/arrays", name="w")
    assert "gcs_user_project" not in spec["base"], spec
    assert backend.fsspec_backend.fs("gs://bucket-x/run").requester_pays is False


def test_a_forked_child_leaves_the_parents_credentials_file(tmp_path: Any) -> None:
    """The key file goes when the process that wrote it exits, not when a forked child does."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import os, sys\n"
        "from jaxstruct.orbax import _stores\n"
        "creds = _stores._credentials_file('id', 'secret', None)\n"
        "path = creds['credentials_file']\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)  # a normal exit: the at-exit hooks run in the child\n"
        "os.waitpid(pid, 0)\n"
        "assert os.path.exists(path), 'the child removed the parent key file'\n"
        "print(path)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    )
    path = out.stdout.strip().splitlines()[-1]
    assert not os.path.exists(path)  # and the parent removed it at its own exit
