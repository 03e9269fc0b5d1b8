"""Serialisation for jaxstruct: state dicts, directory bundles and zip archives."""

from ._async import ExportHandle
from ._checkpoint import export, load
from ._codecs import Codec
from ._errors import CheckpointWriteError
from ._formats import (
    ArraySpec,
    Format,
    OpenedCheckpoint,
    PendingWrite,
    host_array,
    host_pieces,
    place,
)
from ._inspect import CheckpointInfo, inspect
from ._limits import Limits
from ._manager import CheckpointManager
from ._plain import join_path
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
    "ArraySpec",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointWriteError",
    "Codec",
    "ExportHandle",
    "Format",
    "Limits",
    "OpenedCheckpoint",
    "PendingWrite",
    "PluginError",
    "PluginRegistry",
    "export",
    "from_state_dict",
    "hookimpl",
    "host_array",
    "host_pieces",
    "inspect",
    "join_path",
    "load",
    "place",
    "register_codec",
    "register_format",
    "to_state_dict",
]
