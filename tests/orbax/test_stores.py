"""How the orbax format reaches object stores, without a server: the extras named, the
tensorstore spec an s3:// directory gets, the settings it takes from the environment or
from configure_s3."""

from __future__ import annotations

import importlib.util
import os
import stat
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
