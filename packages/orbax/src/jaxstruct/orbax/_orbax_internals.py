"""The orbax-checkpoint internals the format relies on, all behind this one seam.

Orbax has no public API for two things the format needs: opening the
tensorstore of one saved array (to read it straight into device shards), and
the name of the step metadata file that marks a finished orbax checkpoint.
Both are taken here and only here; a missing piece raises a
:class:`~jaxstruct.registry.SerializationError` naming the installed orbax
version and the supported range (``orbax-checkpoint`` is pinned below its next
minor version in this distribution's requirements).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jaxstruct.registry import SerializationError

__all__ = ["STEP_METADATA_FILE", "SUPPORTED", "open_array_stores"]

#: The orbax-checkpoint versions this distribution declares (its requirements).
SUPPORTED = ">=0.12,<0.13"

#: The file orbax writes into a step directory when the step is complete.
STEP_METADATA_FILE = "_CHECKPOINT_METADATA"

_TYPE_HANDLERS = ("is_ocdbt_checkpoint", "get_ts_context", "ParamInfo", "get_json_tspec_read")


def _type_handlers() -> Any:
    import orbax.checkpoint as ocp

    handlers = getattr(ocp, "type_handlers", None)
    missing = [name for name in _TYPE_HANDLERS if not hasattr(handlers, name)]
    if missing:
        version = getattr(ocp, "__version__", "unknown")
        raise SerializationError(
            f"orbax-checkpoint {version} lacks type_handlers.{', '.join(missing)}, which the "
            f"'orbax' format reads arrays with; install orbax-checkpoint{SUPPORTED}"
        )
    return handlers


def open_array_stores(
    directory: Any, keys: Iterable[str], *, use_zarr3: bool, cache_bytes: int
) -> dict[str, Any]:
    """Start opening the tensorstore of each saved array ``key`` under ``directory``.

    Returns ``key -> future`` (``.result()`` gives the open ``TensorStore``).
    """
    import tensorstore as ts

    th = _type_handlers()
    use_ocdbt = th.is_ocdbt_checkpoint(directory)
    context = ts.Context(
        {"cache_pool": {"total_bytes_limit": cache_bytes}},
        parent=th.get_ts_context(use_ocdbt=use_ocdbt),
    )
    opening = {}
    for key in keys:
        info = th.ParamInfo(
            name=key,
            parent_dir=directory,
            is_ocdbt_checkpoint=use_ocdbt,
            use_zarr3=use_zarr3,
            ts_context=context,
        )
        spec = th.get_json_tspec_read(info, use_ocdbt=use_ocdbt)
        opening[key] = ts.open(spec, open=True, read=True, context=context)
    return opening
