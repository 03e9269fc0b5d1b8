"""Serialisation for jaxstruct: state dicts, directory bundles and zip archives."""

from ._async import ExportHandle
from ._budget import BUDGET_ENV as HOST_BUDGET_ENV
from ._budget import host_budget, reserve_host
from ._checkpoint import export, load
from ._formats import (
    ArraySpec,
    Format,
    ManifestNode,
    OpenedCheckpoint,
    PendingWrite,
    RemoteDirectory,
    array_paths,
    empty_array,
    host_array,
    host_pieces,
    place,
    walk,
)
from ._fs import CheckpointWriteError
from ._host import host_chunks
from ._inspect import CheckpointInfo, inspect
from ._manager import CheckpointManager
from ._multihost import SYNC_TIMEOUT_ENV, sync_timeout
from ._plain import join_path
from ._plugins import (
    ALLOW_ENV,
    AUTOLOAD_ENV,
    BLOCK_ENV,
    ENTRY_POINT_GROUP,
    PLUGIN_API_VERSION,
    PluginError,
    PluginInfo,
    PluginRegistry,
    PluginWarning,
    current_registry,
    hookimpl,
    register_codec,
    register_format,
)
from ._process import at_fork, map_on_workers, submit_to_workers
from ._schema import Limits, parse_json
from ._state import from_state_dict, to_state_dict
from ._targets import SavedSharding, saved_sharding
from ._values import Codec

__all__ = [
    "ALLOW_ENV",
    "AUTOLOAD_ENV",
    "BLOCK_ENV",
    "ENTRY_POINT_GROUP",
    "HOST_BUDGET_ENV",
    "PLUGIN_API_VERSION",
    "SYNC_TIMEOUT_ENV",
    "ArraySpec",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointWriteError",
    "Codec",
    "ExportHandle",
    "Format",
    "Limits",
    "ManifestNode",
    "OpenedCheckpoint",
    "PendingWrite",
    "PluginError",
    "PluginInfo",
    "PluginRegistry",
    "PluginWarning",
    "RemoteDirectory",
    "SavedSharding",
    "array_paths",
    "at_fork",
    "current_registry",
    "empty_array",
    "export",
    "from_state_dict",
    "hookimpl",
    "host_array",
    "host_budget",
    "host_chunks",
    "host_pieces",
    "inspect",
    "join_path",
    "load",
    "map_on_workers",
    "parse_json",
    "place",
    "register_codec",
    "register_format",
    "reserve_host",
    "saved_sharding",
    "submit_to_workers",
    "sync_timeout",
    "to_state_dict",
    "walk",
]
