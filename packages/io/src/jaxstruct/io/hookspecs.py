"""Hook specifications of ``jaxstruct.io`` plugins.

A plugin is a module or object with functions marked by
:data:`jaxstruct.io.hookimpl`. Distributions advertise one under the
``jaxstruct.io`` entry-point group::

    [project.entry-points."jaxstruct.io"]
    datetime = "jaxstruct_plugin_datetime"

The hooks run once, the first time a format or codec is needed, and every name
they return must be unique across all plugins. A hook that raises, or returns
anything but instances, fails its plugin alone (with a warning naming it and
its distribution); a name two plugins return is unusable until one is removed.
This is version 1 of the interface (:data:`jaxstruct.io.PLUGIN_API_VERSION`);
a plugin module may declare ``JAXSTRUCT_IO_PLUGIN_API = 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from ._formats import Format
    from ._values import Codec

__all__ = ["hookspec", "jaxstruct_register_codecs", "jaxstruct_register_formats"]

hookspec = pluggy.HookspecMarker("jaxstruct")


@hookspec
def jaxstruct_register_codecs() -> Sequence[Codec]:  # type: ignore[empty-body]
    """Return the value codecs this plugin provides.

    A codec stores values of types the manifest cannot hold natively (for
    example ``datetime.datetime``) under a registered name; see
    :class:`jaxstruct.io.Codec`.
    """


@hookspec
def jaxstruct_register_formats() -> Sequence[Format]:  # type: ignore[empty-body]
    """Return the on-disk formats this plugin provides; see :class:`jaxstruct.io.Format`."""
