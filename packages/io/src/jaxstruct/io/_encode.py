"""Turning a value into a manifest: a post-order node table plus the arrays it references,
the dtype names of those arrays, and the manifest's JSON text."""

from __future__ import annotations

import base64
import enum
import functools
import inspect
import json
import math
import operator
import re
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from jaxstruct.registry import (
    SerializationError,
    StructError,
    class_ref,
    is_registered_pytree_type,
    lookup_class,
    register_class_ref,
    resolve_pytree_spec,
)

# zlib-ng's CRC-32 runs several times faster than zlib's.
from zlib_ng.zlib_ng import crc32

from . import _process
from ._nodes import (
    ARRAY,
    BOOL,
    BYTES,
    CALLABLE,
    CLASS,
    CODEC,
    COMPLEX,
    DICT,
    ENUM,
    FLOAT,
    INT,
    JAXARRAY,
    MAPPING,
    NAMEDTUPLE,
    NONE,
    NPSCALAR,
    PATH,
    PATH_TYPES,
    PRNGKEY,
    PYTREE,
    SCALARTYPE,
    SEQUENCES,
    STR,
    STRUCT,
)
from ._plugins import current_registry
from ._schema import BY_FORMAT, DEFAULT_LIMITS, FORMAT_VERSION, MARKER, ML_NAMES, NUMPY_STR, clip
from ._values import flatten_named, known_mapping_ref

_NAMES: dict[np.dtype, str] = {}  # dtypes already found storable, by their manifest name


def dtype_name(dtype: np.dtype, where: object) -> str:
    """Return the manifest name of ``dtype``, or raise if it cannot be stored exactly."""
    found = _NAMES.get(dtype)
    if found is not None:
        return found
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise SerializationError(
            f"cannot export the array at {where}: dtype {dtype!r} holds Python objects or "
            "fields and has no exact pickle-free form; convert it to a plain numeric, bool, "
            "bytes or str dtype first"
        )
    if dtype.type.__module__.startswith("ml_dtypes"):
        if dtype.name not in ML_NAMES:
            raise SerializationError(
                f"cannot export the array at {where}: ml_dtypes dtype {dtype.name!r} is not "
                f"supported; supported extension dtypes are {sorted(ML_NAMES)}"
            )
        name = dtype.name
    else:
        name = dtype.str
        if not NUMPY_STR.match(name):
            raise SerializationError(
                f"cannot export the array at {where}: dtype {dtype!r} (kind {dtype.kind!r}) is "
                "not supported; convert it to a numeric, bool, bytes, str or datetime dtype first"
            )
    if len(_NAMES) < 1024:
        _NAMES[dtype] = name
    return name


_SAFE_INT = 1 << 53
#: The tag of each sequence type.
_SEQUENCE_TAGS = {cls: tag for tag, cls in SEQUENCES.items()}


def encode_float(x: float) -> float | str:
    """Return ``x`` as a JSON number, or the hex of its bits when it is not finite."""
    if math.isfinite(x):
        return x
    return struct.pack(">d", x).hex()


def _remember_class(cls: type) -> str:
    """Return the reference of an enum or namedtuple class, caching it for this process."""
    ref = class_ref(cls)
    cached = lookup_class(ref)
    if cached is not cls and (cached is None or not is_registered_pytree_type(cached)):
        register_class_ref(cls, ref)
    return ref


#: ``(id(codec), class) -> codec`` for the pairs whose decode gave back a value of the
#: codec's types, checked once per process: a codec that breaks it would write checkpoints
#: that never load. (Keyed by identity: a codec's functions need not be hashable; the
#: codec is kept, so its id is never reused.)
_DECODES_ITS_TYPE: dict[tuple[int, type], Any] = {}


def _codec_source(codec: Any) -> str:
    """Who registered ``codec`` (a plugin and its distribution), for messages."""
    try:
        return current_registry().describe_source("codec", codec.name)
    except (KeyError, StructError):
        return "not registered"


def _check_codec(codec: Any, value: Any, path: _Path) -> None:
    """Refuse ``codec`` unless its ``decode`` gives back a value of its types from what its
    ``encode`` makes of ``value`` (once per codec and class; ``encode`` runs again, so that
    a ``decode`` changing its argument changes nothing that is stored)."""
    cls = type(value)
    where = f"cannot export the {cls.__qualname__} value at {path}: codec {codec.name!r}"
    who = _codec_source(codec)
    try:
        back = codec.decode(codec.encode(value))
    except Exception as err:
        raise SerializationError(
            f"{where} ({who}) cannot decode what its own encode made of it "
            f"({type(err).__name__}: {err}), so the checkpoint could never be loaded; nothing "
            "was written. The codec's decode must accept what its encode returns"
        ) from err
    if type(back) not in codec.types:
        expected = ", ".join(t.__qualname__ for t in codec.types)
        raise SerializationError(
            f"{where} ({who}) decodes what its own encode made of it as "
            f"{type(back).__qualname__}, which is not one of its types ({expected}), so the "
            "checkpoint could never be loaded; nothing was written. The codec's decode must "
            f"return the {cls.__qualname__} its encode was given"
        )
    _DECODES_ITS_TYPE[id(codec), cls] = codec


class _Path:
    """Where a value sits in the exported tree, built only when a message needs it."""

    __slots__ = ("arg", "kind", "parent")

    def __init__(self, parent: _Path | None, kind: str, arg: Any) -> None:
        self.parent = parent
        self.kind = kind
        self.arg = arg

    def __str__(self) -> str:
        steps: list[str] = []
        node: _Path | None = self
        while node is not None:
            kind, arg = node.kind, node.arg
            if kind == "index":
                steps.append(f"[{arg}]")
            elif kind == "key":
                steps.append(f".<key {clip(repr(arg), 40)}>")
            elif kind == "item":
                steps.append(f"[{clip(repr(arg), 40)}]")
            elif kind in ("attr", "field"):
                steps.append(f".{arg}")
            else:  # "text" or "foreign": a literal step, or the root's name
                steps.append(arg)
            node = node.parent
        return "".join(reversed(steps))


_ROOT = _Path(None, "text", "root")


class _Encoder:
    def __init__(self) -> None:
        self.nodes: list[list[Any]] = []
        self.meta: dict[str, dict[str, Any]] = {}
        self.data: dict[str, Any] = {}  # numpy.ndarray or jax.Array, as the user holds it

    def _array(self, arr: Any, path: _Path, tag: str) -> list[Any]:
        name = dtype_name(arr.dtype, path)
        key = f"a{len(self.data)}"
        self.meta[key] = {"dtype": name, "shape": list(arr.shape)}
        self.data[key] = arr
        return [tag, key]

    def _jax_array(self, value: Any, path: _Path) -> list[Any]:
        # The array is kept as the user holds it (possibly sharded over devices or
        # processes): the format writes it shard by shard, so nothing is gathered here.
        import jax

        if isinstance(value, jax.core.Tracer):  # pyright: ignore[reportAttributeAccessIssue]
            raise SerializationError(
                f"cannot export the value at {path}: it is a JAX tracer; export outside "
                "jit/grad/vmap, on concrete values"
            )
        if value.is_deleted():
            raise SerializationError(
                f"cannot export the JAX array at {path}: it has been deleted (donated to a jitted "
                "function?); export it before donating it"
            )
        # (A typed key's dtype is not a NumPy dtype: ordinary arrays skip the check.)
        if not isinstance(value.dtype, np.dtype) and jax.numpy.issubdtype(
            value.dtype, jax.dtypes.prng_key
        ):
            # A typed PRNG key: store its raw key data and the name of its implementation.
            impl = str(jax.random.key_impl(value))
            node = self._array(jax.random.key_data(value), path, PRNGKEY)
            node.append(impl)
            return node
        node = self._array(value, path, JAXARRAY)
        if getattr(value, "weak_type", False):
            # A weakly typed scalar (jnp.asarray(0.1)) must come back weak: jit's
            # cache key includes it, so a strong one would retrace after loading.
            node.append("weak")
        return node

    def run(self, root: Any) -> int:
        # A frame is (value, path, depth) to visit, or (None, finish, count, container id)
        # to build a node from the last ``count`` results once the children are done.
        stack: list[tuple[Any, ...]] = [(root, _ROOT, 0)]
        results: list[int] = []
        active: set[int] = set()
        max_depth = DEFAULT_LIMITS.max_depth
        while stack:
            frame = stack.pop()
            if len(frame) == 4:
                _, finish, count, key = frame
                children = results[len(results) - count :] if count else []
                del results[len(results) - count :]
                active.discard(key)
                self.nodes.append(finish(children))
                results.append(len(self.nodes) - 1)
                continue
            value, path, depth = frame
            if depth >= max_depth:
                raise SerializationError(
                    f"cannot export the value at {path}: nesting is deeper than "
                    f"{max_depth} levels (a cycle through a codec, or a runaway structure)"
                )
            leaf = self._leaf(value, path)
            if leaf is not None:
                self.nodes.append(leaf)
                results.append(len(self.nodes) - 1)
                continue
            finish, children = self._container(value, path)
            key = id(value)
            if key in active:
                raise SerializationError(
                    f"cannot export the value at {path}: it contains itself (a reference cycle)"
                )
            active.add(key)
            stack.append((None, finish, len(children), key))
            for child, child_path in reversed(children):
                stack.append((child, child_path, depth + 1))
        (root_index,) = results
        return root_index

    def _leaf(self, value: Any, path: _Path) -> list[Any] | None:
        cls = type(value)
        if value is None:
            return [NONE]
        if cls is bool:
            return [BOOL, value]
        if cls is int:
            return [INT, value if -_SAFE_INT < value < _SAFE_INT else hex(value)]
        if cls is float:
            return [FLOAT, encode_float(value)]
        if cls is complex:
            return [COMPLEX, encode_float(value.real), encode_float(value.imag)]
        if cls is str:
            return [STR, value]
        if cls is bytes:
            return [BYTES, base64.b64encode(value).decode("ascii")]
        if cls is np.ndarray:
            return self._array(value, path, ARRAY)
        if isinstance(value, np.generic):
            dtype = value.dtype
            return [NPSCALAR, dtype_name(dtype, path), value.tobytes().hex()]
        # Not imported, or being imported by another thread (no ``Array`` yet): then no
        # value is a JAX array.
        array_type = getattr(sys.modules.get("jax"), "Array", None)
        if array_type is not None and isinstance(value, array_type):
            return self._jax_array(value, path)
        if isinstance(value, enum.Enum):
            return [ENUM, _remember_class(cls), _member_name(value, path)]
        if PATH_TYPES.get(cls.__name__) is cls:
            return [PATH, cls.__name__, str(value)]
        if isinstance(value, type):
            scalar = _scalar_type(value)
            if scalar is not None or _ancestor(path, "foreign") is None:
                return scalar
            # A class in another library's static data (an NNX optimizer's wrt=nnx.Param):
            # stored by reference, found on load by the rules for the classes of nodes.
            return [CLASS, _class_ref_or_error(value, path)]
        return None

    def _container(
        self, value: Any, path: _Path
    ) -> tuple[Callable[[list[int]], list[Any]], list[tuple[Any, _Path]]]:
        cls = type(value)
        tag = _SEQUENCE_TAGS.get(cls)
        if tag is not None:
            items = [(v, _Path(path, "index", i)) for i, v in enumerate(value)]
            return (lambda ch: [tag, ch]), items
        if cls is dict:
            pairs: list[tuple[Any, _Path]] = []
            for k, v in value.items():
                pairs.append((k, _Path(path, "key", k)))
                pairs.append((v, _Path(path, "item", k)))
            return (lambda ch: [DICT, ch]), pairs
        if isinstance(value, tuple) and hasattr(cls, "_fields"):
            ref = _remember_class(cls)
            items = [
                (v, _Path(path, "attr", name)) for name, v in zip(cls._fields, value, strict=False)
            ]
            return (lambda ch: [NAMEDTUPLE, ref, ch]), items
        if is_registered_pytree_type(cls):
            return self._pytree(value, path)
        codec = current_registry().codec_for_type(cls)
        if codec is not None:
            try:
                stored = codec.encode(value)
            except Exception as err:
                raise SerializationError(
                    f"cannot export the {cls.__qualname__} value at {path}: codec "
                    f"{codec.name!r} ({_codec_source(codec)}) failed "
                    f"({type(err).__name__}: {err})"
                ) from err
            if (id(codec), cls) not in _DECODES_ITS_TYPE:
                _check_codec(codec, value, path)
            name = codec.name
            return (lambda ch: [CODEC, name, ch[0]]), [(stored, _Path(path, "text", f".<{name}>"))]
        foreign = flatten_named(value)
        if foreign is not None:
            return self._foreign(value, path, *foreign)
        ref = known_mapping_ref(cls)
        if ref is not None:  # flax NNX keeps one in a module's static data
            return (lambda ch: [MAPPING, ref, ch[0]]), [
                (dict(value), _Path(path, "text", ".<items>"))
            ]
        if (
            inspect.isroutine(value)
            or isinstance(value, functools.partial)
            or (callable(value) and hasattr(value, "__wrapped__") and not isinstance(value, type))
        ):  # a function (or a wrapped one), which checkpoints never store
            if _ancestor(path, "foreign") is not None:
                name = _code_name(value)
                return (lambda ch: [CALLABLE, name]), []
            raise _code_error(value, path)
        raise SerializationError(
            f"cannot export the value at {path}: type {cls.__module__}.{cls.__qualname__} is not "
            "supported; make it a Struct, register it with register_pytree_type() (with a "
            "serializer), add a codec with jaxstruct.io.register_codec(), or convert it to a "
            "supported type"
        )

    def _foreign(
        self, value: Any, path: _Path, children: list[Any], aux: Any, names: list[str] | None
    ) -> tuple[Callable[[list[int]], list[Any]], list[tuple[Any, _Path]]]:
        """A node of a class registered with JAX only (equinox, flax.struct, chex); its
        children's names (JAX's key paths) go with it, so arrays are named by them."""
        ref = class_ref(type(value))
        items = [(aux, _Path(path, "foreign", ".<static>"))]
        steps = names or [f"<child {i}>" for i in range(len(children))]
        items += [
            (c, _Path(path, "foreign", f".{step}")) for c, step in zip(children, steps, strict=True)
        ]
        if names is None:
            return (lambda ch: [PYTREE, ref, "j", ch[0], ch[1:]]), items
        return (lambda ch: [PYTREE, ref, "j", ch[0], ch[1:], names]), items

    def _pytree(
        self, value: Any, path: _Path
    ) -> tuple[Callable[[list[int]], list[Any]], list[tuple[Any, _Path]]]:
        cls = type(value)
        spec = resolve_pytree_spec(cls)
        ref = class_ref(cls)
        if spec.kind == "struct":  # (the registry's kind of class, not a node tag)
            stored = [f for f in _struct_fields(cls) if f.should_serialize]
            names = [f.name for f in stored]
            # One letter per field: n(ode), s(tatic) or o(paque), for readers such
            # as ``jaxstruct inspect`` that never import the class.
            kinds = "".join(f.kind.value[0] for f in stored)
            version = getattr(cls, "__struct_version__", 0)
            if isinstance(version, bool) or not isinstance(version, int) or version < 0:
                raise SerializationError(
                    f"{cls.__qualname__}.__struct_version__ must be a non-negative int, got "
                    f"{version!r}"
                )
            items = [(getattr(value, n), _Path(path, "field", n)) for n in names]

            def finish_struct(ch: list[int]) -> list[Any]:
                return [STRUCT, ref, version, dict(zip(names, ch, strict=True)), kinds]

            return finish_struct, items
        try:
            children, aux = spec.flatten(value)
            children = list(children)
            if spec.serializer is not None:
                payload, mode = spec.serializer(value), "s"
            else:
                payload, mode = aux, "a"
        except Exception as err:
            raise SerializationError(
                f"cannot export the {cls.__qualname__} value at {path}: its flatten or "
                f"serializer function failed ({type(err).__name__}: {err})"
            ) from err
        items = [(payload, _Path(path, "text", ".<payload>"))]
        items += [(c, _Path(path, "text", f".<child {i}>")) for i, c in enumerate(children)]
        return (lambda ch: [PYTREE, ref, mode, ch[0], ch[1:]]), items


def _scalar_type(cls: type) -> list[Any] | None:
    """A NumPy or ``jax.numpy`` scalar type (``jnp.float32``, a module's ``param_dtype``) as
    ``["scalartype", library, dtype name]``, or ``None`` for any other class."""
    dtype = getattr(cls, "dtype", None) if not issubclass(cls, np.generic) else None
    if isinstance(dtype, np.dtype):  # jax.numpy's scalar types carry their dtype
        jnp = sys.modules.get("jax.numpy")
        if jnp is not None and getattr(jnp, dtype.name, None) is cls:
            return [SCALARTYPE, "jax", dtype.name]
        return None
    if issubclass(cls, np.generic) and cls not in (np.generic, np.object_):
        try:
            name = np.dtype(cls).name
        except TypeError:
            return None
        if getattr(np, name, None) is cls:
            return [SCALARTYPE, "numpy", name]
    return None


def _class_ref_or_error(cls: type, path: _Path) -> str:
    try:
        return class_ref(cls)
    except Exception as err:
        raise SerializationError(
            f"cannot export the class at {path}: it has no importable name ({err}); define "
            "it at module level"
        ) from None


def _member_name(value: enum.Enum, path: _Path) -> str:
    """An enum member's name; a combination of flags is its members' names joined by ``|``."""
    name = value.name
    if isinstance(value, enum.Flag) and name not in type(value).__members__:
        parts = list(value)  # the named flags it is made of
        if functools.reduce(operator.or_, parts, type(value)(0)) != value:
            raise SerializationError(
                f"cannot export the value at {path}: the flag {value!r} holds bits no member of "
                f"{type(value).__qualname__} names; store int(value) instead, or name those bits"
            )
        name = "|".join(str(member.name) for member in parts)
    return str(name)


def _code_name(value: Any) -> str:
    func = getattr(value, "func", value)  # a partial names the function it wraps
    module = getattr(func, "__module__", None) or "?"
    return f"{module}:{getattr(func, '__qualname__', type(func).__qualname__)}"


def _ancestor(path: _Path, kind: str) -> _Path | None:
    """The nearest step of ``kind`` on ``path`` (itself included), or ``None``."""
    node: _Path | None = path
    while node is not None and node.kind != kind:
        node = node.parent
    return node


def _code_error(value: Any, path: _Path) -> SerializationError:
    """The error for a function met outside other libraries' nodes: name the field to skip."""
    field = _ancestor(path, "field")
    where = (
        f"it belongs to the struct field at {field}, so declare that field with serialize=False "
        "(js.field(static=True, default=None, serialize=False)): it is then not stored, and "
        "load(..., target=...) takes its value from the target"
        if field is not None
        else "keep code out of the exported value (export the data, and rebuild functions "
        "from your own code), or hold it in a struct field declared with serialize=False"
    )
    return SerializationError(
        f"cannot export the value at {path}: it is the function {_code_name(value)!r}, and "
        f"checkpoints store data, never code; {where}"
    )


def encode_state(obj: Any) -> dict[str, Any]:
    """Return the state dict of ``obj``: version, manifest, arrays metadata and array data."""
    encoder = _Encoder()
    # The walk allocates many small lists that are never cyclic; pausing the
    # cyclic collector keeps its full scans from making deep trees quadratic.
    with _process.paused():
        root = encoder.run(obj)
    return {
        "version": FORMAT_VERSION,
        "manifest": {"root": root, "nodes": encoder.nodes},
        "arrays": encoder.meta,
        "array_data": encoder.data,
    }


def _struct_fields(cls: type) -> list[Any]:
    """The ``FieldSpec`` objects of a Struct class, in declaration order."""
    import jaxstruct.core as js

    return list(js.fields(cls).values())


_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _node_encoder() -> Callable[[Any], str]:
    """Return a function giving the compact JSON text of one node."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - Python builds without the _json accelerator
        return _ENCODER.encode
    try:
        # markers=None: no cycle check (nodes are fresh lists of scalars and lists).
        encode = make(
            None,
            _ENCODER.default,
            json.encoder.encode_basestring_ascii,
            None,
            ":",
            ",",
            False,
            False,
            False,
        )
    except TypeError:  # pragma: no cover - a future signature: use the plain encoder
        return _ENCODER.encode
    return lambda node: "".join(encode(node, 0))


# The seal a manifest ends with (``_schema`` checks it on every load): the CRC-32 of
# every byte before it, as the last member of the JSON object.
_SEAL_VALUE = re.compile(r"crc32:[0-9a-f]{8}")


def dump_manifest(
    state: Mapping[str, Any], container: str, checksums: Mapping[str, Any] = BY_FORMAT
) -> bytes:
    """Serialise the JSON part of a state dict as sealed manifest bytes (one node per line).

    ``checksums`` is the manifest's ``checksums`` section: :data:`BY_FORMAT`, or the
    CRC-32s jaxstruct computed of every array (``_checksums.checksums_of``).
    """
    head = _head(state["version"], container, state["arrays"], checksums, state["manifest"])
    return b'%s,"seal":"crc32:%08x"}\n' % (head, crc32(head))


def _head(
    version: Any, container: Any, arrays: Any, checksums: Any, manifest: Mapping[str, Any]
) -> bytes:
    """The manifest's bytes up to its seal: the one layout jaxstruct writes."""
    enc = _ENCODER.encode
    with _process.paused():
        nodes = ",\n".join(map(_node_encoder(), manifest["nodes"]))
        return (
            f'{{"format":{enc(MARKER)},"version":{enc(version)},'
            f'"container":{enc(container)},\n"arrays":{enc(arrays)},\n'
            f'"checksums":{enc(checksums)},\n'
            f'"manifest":{{"root":{enc(manifest["root"])},"nodes":[\n{nodes}]}}'
        ).encode("ascii")


_DOCUMENT_KEYS = ("format", "version", "container", "arrays", "checksums", "manifest", "seal")


def _head_of(document: Mapping[str, Any], what: str) -> bytes:
    """The head of a manifest rebuilt from its parsed JSON (``document``)."""
    manifest = document.get("manifest") if isinstance(document, Mapping) else None
    if (
        not isinstance(document, Mapping)
        or set(document) - {"seal"} != set(_DOCUMENT_KEYS) - {"seal"}
        or document.get("format") != MARKER
        or not isinstance(manifest, Mapping)
        or set(manifest) != {"root", "nodes"}
        or not isinstance(manifest["nodes"], list)
    ):
        raise SerializationError(
            f"{what}: expected a parsed jaxstruct manifest of format version 2 (keys "
            f"{list(_DOCUMENT_KEYS)}); restore the checkpoint from a copy"
        )
    try:
        return _head(
            document["version"],
            document["container"],
            document["arrays"],
            document["checksums"],
            manifest,
        )
    except (TypeError, ValueError) as err:
        raise SerializationError(f"{what}: the manifest cannot be written back ({err})") from None


def manifest_from_json(document: Mapping[str, Any], *, where: str = "") -> bytes:
    """Return the exact manifest bytes export gave a format, from their parsed JSON.

    For a format whose storage keeps the manifest as a JSON document it writes
    out itself (orbax's JSON items), so the bytes ``write`` received are not the
    bytes stored: ``OpenedCheckpoint.manifest = manifest_from_json(document)``
    gives them back. The stored seal is kept as it is, so a document changed after
    it was written still fails its check on load. A document of format version 1
    (no seal) comes back as compact JSON. ``where`` (the file) starts the messages.

    Raises:
        SerializationError: ``document`` is not a parsed jaxstruct manifest.

    Example:
        >>> import json, numpy as np
        >>> from jaxstruct.io import to_state_dict
        >>> written = dump_manifest(to_state_dict({"w": np.ones(2)}), "tar")
        >>> manifest_from_json(json.loads(written)) == written
        True
    """
    if isinstance(document, Mapping) and document.get("version") == 1:
        return _ENCODER.encode(dict(document)).encode("ascii")
    head = _head_of(document, where or "manifest_from_json()")
    seal = document.get("seal")
    if not isinstance(seal, str) or _SEAL_VALUE.fullmatch(seal) is None:
        return head + b"}\n"  # no seal: refused as such when it is parsed
    return b'%s,"seal":"%s"}\n' % (head, seal.encode("ascii"))


def seal_manifest(document: Mapping[str, Any]) -> bytes:
    """Return manifest bytes for ``document`` (parsed JSON, edited on purpose), sealed anew.

    A checkpoint's manifest is sealed when it is written, and a load refuses a
    manifest whose bytes no longer match their seal. After changing a manifest
    deliberately (a hand-made migration), write back ``seal_manifest(edited)``;
    its ``seal`` (and a directory checkpoint's ``checksum``) member is dropped.

    Raises:
        SerializationError: ``document`` is not a parsed jaxstruct manifest of
            format version 2.

    Example:
        >>> import json, pathlib, tempfile, numpy as np
        >>> import jaxstruct.io as jio
        >>> path = jio.export({"w": np.ones(2)}, pathlib.Path(tempfile.mkdtemp()) / "ck")
        >>> top = json.loads((path / "manifest.json").read_bytes())
        >>> top["manifest"]["nodes"][0] = ["str", "v"]  # the key "w" renamed by hand
        >>> _ = (path / "manifest.json").write_bytes(jio.seal_manifest(top))
        >>> jio.load(path)
        {'v': array([1., 1.])}
    """
    if isinstance(document, Mapping):
        document = {k: v for k, v in document.items() if k not in ("seal", "checksum")}
    head = _head_of(document, "seal_manifest()")
    return b'%s,"seal":"crc32:%08x"}\n' % (head, crc32(head))
