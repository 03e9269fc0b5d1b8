"""The entry-point module of jaxstruct-orbax: registers the ``orbax`` format like any plugin."""

from __future__ import annotations

from collections.abc import Sequence

from jaxstruct.io import Format, hookimpl

from ._format import OrbaxFormat

__all__ = ["JAXSTRUCT_IO_PLUGIN_API", "jaxstruct_register_formats"]

#: The jaxstruct.io plugin interface this plugin is written for.
JAXSTRUCT_IO_PLUGIN_API = 1


@hookimpl
def jaxstruct_register_formats() -> Sequence[Format]:
    """Provide the ``orbax`` format (chosen with ``export(..., format="orbax")``)."""
    return [OrbaxFormat()]
