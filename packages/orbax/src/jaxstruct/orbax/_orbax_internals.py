"""The orbax-checkpoint internals the format relies on, all behind this one seam.

Orbax has no public API for five things the format needs: opening the
tensorstore of one saved array (to read it straight into device shards), the
name of the step metadata file that marks a finished orbax checkpoint, a
tensorstore kvstore for ``s3://`` paths, or one with settings of ours for ``gs://``
(:func:`route_stores`), the layout of the stored chunks, each a unit the
format checksums (:func:`chunk_layout`), and copying arrays to the host in
batches within a byte limit (:func:`batched_transfers`). All are taken here
and only here; a missing piece raises a
:class:`~jaxstruct.registry.SerializationError` naming the installed orbax
version and the one this release was tested with. ``orbax-checkpoint`` has no
upper bound in this distribution's requirements (a cap would hold back every
other package a user installs beside jaxstruct), so a release that moves one of
these pieces is met here, with that error, and never as a foreign traceback.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jaxstruct.registry import SerializationError

__all__ = [
    "STEP_METADATA_FILE",
    "SUPPORTED",
    "TESTED",
    "batched_transfers",
    "chunk_layout",
    "open_array_stores",
    "route_s3",
    "route_stores",
]

#: The orbax-checkpoint versions this distribution declares (its requirements).
SUPPORTED = ">=0.12.5"
#: The newest orbax-checkpoint minor version CI runs the format's tests with.
TESTED = "0.12"


def _moved(what: str, version: str, needed_by: str) -> SerializationError:
    """Our error for an orbax release that lacks ``what``."""
    return SerializationError(
        f"orbax-checkpoint {version} lacks {what}, which {needed_by}; this jaxstruct-orbax "
        f"was tested with orbax-checkpoint {TESTED}: install orbax-checkpoint=={TESTED}.* "
        f"(pip install 'orbax-checkpoint=={TESTED}.*'), or a jaxstruct-orbax release that "
        f"supports orbax-checkpoint {version}"
    )


#: The file orbax writes into a step directory when the step is complete.
STEP_METADATA_FILE = "_CHECKPOINT_METADATA"

_TYPE_HANDLERS = ("is_ocdbt_checkpoint", "get_ts_context", "ParamInfo", "get_json_tspec_read")


def _type_handlers() -> Any:
    import orbax.checkpoint as ocp

    handlers = getattr(ocp, "type_handlers", None)
    missing = [name for name in _TYPE_HANDLERS if not hasattr(handlers, name)]
    if missing:
        version = getattr(ocp, "__version__", "unknown")
        raise _moved(
            f"type_handlers.{', '.join(missing)}", version, "the 'orbax' format reads arrays with"
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


# The kvstore spec builder every orbax 0.12 array save, restore and OCDBT merge calls.
_BUILDER = "build_kvstore_tspec"

# scheme -> what becomes of each GCS store in the spec orbax builds for such a directory
_ROUTES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def route_s3(kvstore: Callable[[str, str], dict[str, Any]]) -> None:
    """Let orbax write and read arrays at ``s3://`` paths, through tensorstore's ``s3`` driver.

    orbax-checkpoint 0.12's ``tensorstore_utils.build_kvstore_tspec`` gives
    tensorstore's ``gcs`` driver to ``gs://`` directories and its ``file`` driver
    to every other path, and refuses an ``s3://`` one as "not absolute" (its
    ``_build_ocdbt_kvstore_tspec``), although its own ``is_remote_storage``
    knows ``s3://``. Its builder is wrapped (:func:`route_stores`) so that for an
    ``s3://`` directory orbax builds its spec exactly as for the same bucket and
    path in GCS (OCDBT layout, read coalescing), and each ``gcs`` store in that
    spec becomes ``kvstore(bucket, path)``. Every other path is left to orbax
    untouched.
    """
    route_stores("s3", lambda store: kvstore(store["bucket"], store.get("path", "")))


def route_stores(scheme: str, store: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """For a ``scheme://`` directory (``gs`` or ``s3``), orbax's spec for the same bucket and
    path in GCS, each of its ``gcs`` stores replaced by ``store(that_store)``.

    Orbax's spec builder is wrapped once per process; a later call for the same
    scheme replaces its ``store``; a path of any other scheme goes to orbax untouched.
    """
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    _ROUTES[scheme] = store
    original = getattr(tsu, _BUILDER, None)
    if original is None:
        import orbax.checkpoint as ocp

        version = getattr(ocp, "__version__", "unknown")
        raise _moved(f"tensorstore_utils.{_BUILDER}", version, f"{scheme}:// paths need")
    if getattr(original, "_jaxstruct_routes", False):
        return

    @functools.wraps(original)
    def build(directory: Any, *args: Any, **kwargs: Any) -> Any:
        head, sep, rest = str(directory).partition("://")
        route = _ROUTES.get(head) if sep else None
        if route is None:
            return original(directory, *args, **kwargs)
        return _replace_gcs_stores(original("gs://" + rest, *args, **kwargs), route)

    build._jaxstruct_routes = True  # type: ignore[attr-defined]
    setattr(tsu, _BUILDER, build)


def _to_s3(spec: Any, kvstore: Callable[[str, str], dict[str, Any]]) -> Any:
    """``spec`` with each GCS store (a JSON object or a ``gs://`` URL) made an S3 one."""
    return _replace_gcs_stores(spec, lambda store: kvstore(store["bucket"], store.get("path", "")))


def _replace_gcs_stores(spec: Any, store: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``spec`` with each GCS store (a JSON object or a ``gs://`` URL) made ``store(it)``."""
    if isinstance(spec, dict):
        if spec.get("driver") in ("gcs", "gcs_grpc") and "bucket" in spec:
            return store(spec)
        return {key: _replace_gcs_stores(value, store) for key, value in spec.items()}
    if isinstance(spec, list):
        return [_replace_gcs_stores(value, store) for value in spec]
    if isinstance(spec, str) and spec.startswith("gs://"):
        bucket, _, path = spec[len("gs://") :].partition("/")
        return store({"driver": "gcs", "bucket": bucket, "path": path})
    return spec


# The spec class every orbax 0.12 array save builds, the zarr metadata builder it calls,
# and the module of the chunk shape chooser it calls (``subchunking.choose_chunk_shape``).
_WRITE_SPEC = "ArrayWriteSpec"
_METADATA_BUILDER = "_build_zarr_shard_and_chunk_metadata"
_CHOOSER = "choose_chunk_shape"
_TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's temporary directory: the target's name + this

#: Private switch for tests: ``True`` stores a CRC-32C codec in every chunk, as
#: jaxstruct-orbax 0.1 did (its checkpoints must keep loading).
_CHUNK_CRC = False

_saving: dict[str, int] = {}  # targets of the saves inside chunk_layout(), how many each
_saving_lock = threading.Lock()
_building = threading.local()  # .ours: the spec being built on this thread is one of ours


@contextlib.contextmanager
def chunk_layout(target: Any) -> Iterator[None]:
    """Inside the block, orbax's zarr v3 arrays saved at ``target`` store each chunk as its
    own object, shaped as the format's checksummed units where it can.

    orbax-checkpoint 0.12 stores a zarr v3 array as one zarr shard per written
    shard (its ``sharding_indexed`` codec), and takes no codecs from its caller.
    Its metadata builder is wrapped so that for the saves of this block alone
    (arrays under ``target``, or orbax's temporary directory beside it), each
    stored chunk is its own object of codecs ``bytes`` (then ``zstd`` when
    compressed); without ``sharding_indexed``, tensorstore encodes one chunk at a
    time instead of a whole shard (a save of 256 MiB peaked 0.1 GiB lower). Its
    chunk shape chooser is wrapped so that each chunk is one unit of
    ``_units.cut``: a contiguous byte range of the written shard, which a restore
    checks where it lands (orbax's own choice may cut the last axis). The
    user's own orbax saves are left untouched.
    """
    from orbax.checkpoint._src.arrays import subchunking
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    _wrap_builders(tsu, subchunking)
    key = str(target).rstrip("/")
    with _saving_lock:
        _saving[key] = _saving.get(key, 0) + 1
    try:
        yield
    finally:
        with _saving_lock:
            _saving[key] -= 1
            if not _saving[key]:
                del _saving[key]


def _is_ours(directory: Any) -> bool:
    path = str(directory).rstrip("/")
    with _saving_lock:
        targets = list(_saving)
    return any(path == t or path.startswith((t + "/", t + _TMP_SUFFIX)) for t in targets if t)


def _wrap_builders(tsu: Any, subchunking: Any) -> None:
    """Wrap orbax's array spec, its zarr metadata builder and its chunk shape chooser,
    once per process."""
    spec_class = getattr(tsu, _WRITE_SPEC, None)
    builder = getattr(tsu, _METADATA_BUILDER, None)
    chooser = getattr(subchunking, _CHOOSER, None)
    if spec_class is None or builder is None or chooser is None:
        import orbax.checkpoint as ocp

        version = getattr(ocp, "__version__", "unknown")
        raise _moved(
            f"tensorstore_utils.{_WRITE_SPEC}, {_METADATA_BUILDER} or subchunking.{_CHOOSER}",
            version,
            "the 'orbax' format's stored chunk layout needs",
        )
    if getattr(builder, "_jaxstruct_checksums", False):
        return
    original_init = spec_class.__init__

    @functools.wraps(original_init)
    def init(self: Any, directory: Any, *args: Any, **kwargs: Any) -> None:
        _building.ours = _is_ours(directory)
        try:
            original_init(self, directory, *args, **kwargs)
        finally:
            _building.ours = False

    @functools.wraps(builder)
    def build(**kwargs: Any) -> Any:
        if not (getattr(_building, "ours", False) and kwargs.get("use_zarr3")):
            return builder(**kwargs)
        return _checksummed_metadata(kwargs["global_shape"], kwargs["chunk_shape"], kwargs)

    @functools.wraps(chooser)
    def choose(global_shape: Any, write_shape: Any, dtype: Any, target: Any, **kw: Any) -> Any:
        ours = getattr(_building, "ours", False) and not kw.get("shard_axes")
        chunk = _unit_chunk(tuple(write_shape), dtype, target) if ours and target else None
        return chooser(global_shape, write_shape, dtype, target, **kw) if chunk is None else chunk

    build._jaxstruct_checksums = True  # type: ignore[attr-defined]
    spec_class.__init__ = init
    setattr(tsu, _METADATA_BUILDER, build)
    setattr(subchunking, _CHOOSER, choose)


def _unit_chunk(write_shape: tuple[int, ...], dtype: Any, target: int) -> tuple[int, ...] | None:
    """The stored chunk that is exactly one unit of ``_units.cut`` for a written shard of
    ``write_shape``; ``None`` when no such unit divides it (orbax then chooses)."""
    import numpy as np

    from ._units import cut

    if not write_shape or 0 in write_shape:
        return None
    axis, step = cut(write_shape, np.dtype(dtype).itemsize, target)
    if write_shape[axis] % step:
        return None
    return (1,) * axis + (step,) + write_shape[axis + 1 :]


def _checksummed_metadata(
    shape: Any, chunk: Any, kwargs: dict[str, Any]
) -> tuple[dict[str, Any], str, int | None]:
    """Zarr v3 metadata of chunks stored one per object, each with its CRC-32C; and orbax's
    compression name and level."""
    compressed = bool(kwargs.get("use_compression", True))
    codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if compressed:  # orbax's own zarr v3 choice: zstd, level 3
        codecs.append({"name": "zstd", "configuration": {"level": 3}})
    if _CHUNK_CRC:
        codecs.append({"name": "crc32c"})
    metadata = {
        "shape": list(shape),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}},
        "codecs": codecs,
    }
    return metadata, ("zstd" if compressed else "none"), (3 if compressed else None)


def batched_transfers() -> Any:
    """A type handler registry for orbax's PyTree handler under which a save copies
    ``jax.Array`` leaves to the host in batches, each written before the next is copied,
    within the handler's ``save_device_host_concurrent_gb``.

    orbax-checkpoint 0.12 applies that limit only to arrays its ``ArrayHandler``'s
    ``SerializationStatusCallback`` calls "deprioritized"; its default callback calls
    every array "synchronous", and those are all copied to the host at once, before
    any is written, whatever the limit. NumPy arrays keep orbax's own handler.
    """
    import jax
    import numpy as np

    try:
        from orbax.checkpoint._src.metadata import array_metadata_store
        from orbax.checkpoint._src.serialization import type_handler_registry, type_handlers
        from orbax.checkpoint._src.serialization import types as serialization_types

        priority = serialization_types.TransferPriority.ASYNCHRONOUS_DEPRIORITIZED
        base = serialization_types.DefaultSerializationStatusCallback
    except (ImportError, AttributeError):
        import orbax.checkpoint as ocp

        version = getattr(ocp, "__version__", "unknown")
        raise _moved(
            "serialization.types.TransferPriority or DefaultSerializationStatusCallback",
            version,
            "the 'orbax' format's bounded device-to-host copies need",
        ) from None

    class _InBatches(base):  # pyright: ignore[reportGeneralTypeIssues, reportUntypedBaseClass]
        def key_priority(self, _: Any) -> Any:
            return priority

    arrays = type_handlers.ArrayHandler(
        array_metadata_store=array_metadata_store.Store(), callback=_InBatches()
    )
    return type_handler_registry.create_type_handler_registry(
        (np.ndarray, type_handlers.NumpyHandler()), (jax.Array, arrays)
    )
