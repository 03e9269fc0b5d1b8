"""Serialisation for jaxstruct: state dicts, directory bundles and zip archives."""

from ._async import ExportHandle
from ._budget import BUDGET_ENV as HOST_BUDGET_ENV
from ._budget import host_budget, reserve_host
from ._encode import manifest_from_json, seal_manifest
from ._export import export
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
from ._host import host_chunks
from ._inspect import CheckpointInfo, inspect
from ._load import load
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
    using,
)
from ._process import at_fork, map_on_workers, submit_to_workers
from ._publish import CheckpointWriteError, flush_while_writing, make_durable
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
    "flush_while_writing",
    "from_state_dict",
    "hookimpl",
    "host_array",
    "host_budget",
    "host_chunks",
    "host_pieces",
    "inspect",
    "join_path",
    "load",
    "make_durable",
    "manifest_from_json",
    "map_on_workers",
    "parse_json",
    "place",
    "register_codec",
    "register_format",
    "reserve_host",
    "saved_sharding",
    "seal_manifest",
    "submit_to_workers",
    "sync_timeout",
    "to_state_dict",
    "using",
    "walk",
]
