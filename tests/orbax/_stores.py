"""The object stores the tests run against, each a local server on 127.0.0.1 (see _gcs, _s3)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from . import _gcs, _s3

#: Every store the orbax format writes to, by the name the tests are parametrized with.
STORES = ("gcs", "s3")


@dataclass(frozen=True)
class Served:
    """A running store: where its bucket is, what a program's environment needs to reach it,
    and the object names under a prefix of the bucket (read from the server itself)."""

    kind: str  # a name of STORES
    root: str  # "gs://bucket" or "s3://bucket"
    url: str  # the server's own http:// URL
    env: dict[str, str]
    objects: Callable[[str], list[str]]


@contextmanager
def serve(kind: str) -> Iterator[Served]:
    """Start the server of ``kind`` with one empty bucket; stop it afterwards."""
    if kind == "gcs":
        with _gcs.fake_gcs() as url:
            yield Served(
                kind,
                f"gs://{_gcs.BUCKET}",
                url,
                _gcs.emulator_env(url),
                lambda p: _gcs.objects(url, p),
            )
    elif kind == "s3":
        with _s3.moto_s3() as url:
            yield Served(
                kind,
                f"s3://{_s3.BUCKET}",
                url,
                _s3.emulator_env(url),
                lambda p: _s3.objects(url, p),
            )
    else:
        raise ValueError(kind)


__all__ = ["STORES", "Served", "serve"]
