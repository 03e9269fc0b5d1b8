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
from ._multihost import SYNC_TIMEOUT_ENV, sync_timeout
from ._plugins import (
    AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    PluginError,
    PluginRegistry,
    hookimpl,
    register_codec,
    register_format,
)
from ._remote import RemoteDirectory
from ._shardings import SavedSharding, saved_sharding
from ._state import from_state_dict, to_state_dict

__all__ = [
    "AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "SYNC_TIMEOUT_ENV",
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
    "RemoteDirectory",
    "SavedSharding",
    "export",
    "from_state_dict",
    "hookimpl",
    "host_array",
    "host_pieces",
    "inspect",
    "load",
    "place",
    "register_codec",
    "register_format",
    "saved_sharding",
    "sync_timeout",
    "to_state_dict",
]
