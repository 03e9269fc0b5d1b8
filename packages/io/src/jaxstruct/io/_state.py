"""In-memory state dicts: :func:`to_state_dict` and :func:`from_state_dict`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from jaxstruct.registry import SerializationError

from ._decode import Resolver, decode_state
from ._encode import encode_state
from ._formats import host_array
from ._schema import check_arrays_table, check_version, limits_from_kwargs

_KEYS = {"version", "manifest", "arrays", "array_data"}


def to_state_dict(obj: Any) -> dict[str, Any]:
    """Return a portable in-memory mapping describing ``obj``.

    The mapping has ``version`` (the format version), ``manifest`` (a JSON-safe
    table of nodes), ``arrays`` (``key -> {"dtype", "shape"}``) and
    ``array_data`` (``key -> numpy array``). NumPy arrays are held as they are,
    not copied; JAX arrays are viewed as NumPy arrays.

    Args:
        obj: a Struct, registered pytree, container or supported plain value.

    Returns:
        The state dict.

    Raises:
        SerializationError: some value cannot be represented exactly; the
            message names its path in the tree.

    Example:
        >>> import numpy as np
        >>> payload = to_state_dict({"w": np.arange(3), "step": 7})
        >>> sorted(payload), payload["arrays"]
        (['array_data', 'arrays', 'manifest', 'version'], {'a0': {'dtype': '<i8', 'shape': [3]}})
    """
    state = encode_state(obj)
    data = state["array_data"]
    for key, arr in data.items():
        if not isinstance(arr, np.ndarray):
            try:
                data[key] = host_array(arr)
            except SerializationError as err:
                raise SerializationError(f"to_state_dict(): {err}") from None
    return state


def from_state_dict(
    payload: Mapping[str, Any],
    *,
    load_cls: Any = None,
    allow_imports: Iterable[str] | None = (),
    **limits: int,
) -> Any:
    """Rebuild the value a state dict describes.

    Classes resolve only through this process's registry, ``load_cls``, or
    modules listed in ``allow_imports``. Struct converters and validators run;
    derived fields are recomputed; ``__struct_migrate__`` upgrades older
    schema versions.

    Args:
        payload: a mapping as returned by :func:`to_state_dict`.
        load_cls: the expected class of the root value (it also resolves the
            root's class reference), or a mapping ``{"module:Qual": cls}``.
        allow_imports: module names (or package prefixes) that may be imported
            to find classes.
        **limits: ``max_depth=`` and ``max_nodes=`` raise those limits.

    Returns:
        The rebuilt value.

    Raises:
        SerializationError: the payload is malformed, names an unknown class,
            or a value cannot be rebuilt; the message says where.

    Example:
        >>> from_state_dict(to_state_dict({"a": (1, 2.5, None)}))
        {'a': (1, 2.5, None)}
    """
    lim = limits_from_kwargs("from_state_dict", limits)
    resolver = Resolver(load_cls, allow_imports)
    source = "state dict"
    if not isinstance(payload, Mapping):
        raise SerializationError(
            f"from_state_dict() expected a mapping, got {type(payload).__name__}"
        )
    if set(payload) != _KEYS:
        raise SerializationError(
            f"{source}: expected exactly the keys {sorted(_KEYS)}, got {sorted(map(str, payload))}"
        )
    check_version(payload["version"], source)
    manifest = payload["manifest"]
    if not isinstance(manifest, Mapping) or set(manifest) != {"root", "nodes"}:
        raise SerializationError(f"{source}: 'manifest' must be a mapping with 'root' and 'nodes'")
    table = check_arrays_table(payload["arrays"], source, lim)
    data = payload["array_data"]
    if not isinstance(data, Mapping) or set(data) != set(table):
        raise SerializationError(
            f"{source}: 'array_data' must hold exactly the arrays 'arrays' lists"
        )
    for key, (dtype, shape, _) in table.items():
        arr = data[key]
        if type(arr) is not np.ndarray:
            raise SerializationError(
                f"{source}: array_data[{key!r}] must be a numpy.ndarray, got "
                f"{type(arr).__name__}; convert it with numpy.asarray"
            )
        if arr.dtype != dtype or arr.shape != shape:
            raise SerializationError(
                f"{source}: array_data[{key!r}] has dtype {arr.dtype} and shape {arr.shape}, "
                f"but 'arrays' says {dtype} and {shape}"
            )
    return decode_state(manifest, table, data, resolver=resolver, limits=lim, source=source)
