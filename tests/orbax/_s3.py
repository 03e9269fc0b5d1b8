"""moto's S3-compatible server on 127.0.0.1 for the tests (moto[server], from PyPI)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BUCKET = "jaxstruct-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.2)
        _client(url).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
