"""The entry-point module of jaxstruct-safetensors: registers the format like any plugin."""

from __future__ import annotations

from collections.abc import Sequence

from jaxstruct.io import Format, hookimpl

from ._format import SafetensorsFormat

__all__ = ["jaxstruct_register_formats"]


@hookimpl
def jaxstruct_register_formats() -> Sequence[Format]:
    """Provide the ``safetensors`` format (chosen by the ``.safetensors`` suffix)."""
    return [SafetensorsFormat()]
