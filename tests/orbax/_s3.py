"""moto's S3-compatible server on 127.0.0.1 for the tests (moto[server], from PyPI)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._server import running

BUCKET = "jaxstruct-test"


def emulator_env(url: str) -> dict[str, str]:
    """What a program's environment holds to use the S3 server at ``url``, with throwaway
    credentials: s3fs (orbax's path layer) and tensorstore (the arrays) both read them, and
    neither looks for credentials or a region anywhere else."""
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "throwaway",
        "AWS_SECRET_ACCESS_KEY": "throwaway",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",  # no profile of the machine's user is read
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",  # botocore never asks the instance metadata
    }


@contextmanager
def moto_s3() -> Iterator[str]:
    """Run moto's server with one bucket; yield its URL; stop it afterwards."""

    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    with running("moto's server", argv, "/moto-api/", timeout=60) as url:
        _client(url).create_bucket(Bucket=BUCKET)
        yield url


def _client(url: str) -> Any:
    import boto3  # moto's own dependency

    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="throwaway",
        aws_secret_access_key="throwaway",
    )


def objects(url: str, prefix: str) -> list[str]:
    """The object names under ``prefix`` in the bucket (moto's S3 API, straight)."""
    client = _client(url)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


__all__ = ["BUCKET", "emulator_env", "moto_s3", "objects"]
