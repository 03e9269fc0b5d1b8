"""The entry-point module of jaxstruct-orbax: registers the ``orbax`` format like any plugin."""

from __future__ import annotations

from collections.abc import Sequence

from jaxstruct.io import Format, hookimpl

from ._format import OrbaxFormat

__all__ = ["jaxstruct_register_formats"]


@hookimpl
def jaxstruct_register_formats() -> Sequence[Format]:
    """Provide the ``orbax`` format (chosen with ``export(..., format="orbax")``)."""
    return [OrbaxFormat()]
