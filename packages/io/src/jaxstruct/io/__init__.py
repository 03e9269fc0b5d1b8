"""Serialisation for jaxstruct: state dicts, directory bundles and zip archives."""

from ._checkpoint import export, load
from ._codecs import Codec
from ._errors import CheckpointWriteError
from ._formats import Format, OpenedCheckpoint
from ._inspect import CheckpointInfo, inspect
from ._limits import Limits
from ._plugins import (
    AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    PluginError,
    PluginRegistry,
    hookimpl,
    register_codec,
    register_format,
)
from ._state import from_state_dict, to_state_dict

__all__ = [
    "AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "CheckpointInfo",
    "CheckpointWriteError",
    "Codec",
    "Format",
    "Limits",
    "OpenedCheckpoint",
    "PluginError",
    "PluginRegistry",
    "export",
    "from_state_dict",
    "hookimpl",
    "inspect",
    "load",
    "register_codec",
    "register_format",
    "to_state_dict",
]
