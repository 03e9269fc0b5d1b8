"""Manifest node table to value: arrays placed, classes resolved safely, partial restore."""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import importlib
import inspect
import math
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from jaxstruct.registry import (
    ClassReferenceError,
    SerializationError,
    StructError,
    class_ref,
    is_registered_pytree_type,
    lookup_class,
    name_classes,
    resolve_class,
    resolve_pytree_spec,
)

from ._jax_private import put_on_default_device, weakly_typed
from ._nodes import (
    ARRAY,
    BOOL,
    BYTES,
    CALLABLE,
    CLASS,
    CLASS_TAGS,
    CODEC,
    COMPLEX,
    DICT,
    ENUM,
    FLOAT,
    FROZENSET,
    INT,
    JAXARRAY,
    LIST,
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
    SET,
    STR,
    STRUCT,
    TUPLE,
    MalformedNode,
    child_names,
    children,
    error_step,
)
from ._plugins import current_registry
from ._schema import Limits, clip, parse_dtype
from ._targets import TargetMatch, mark_unused
from ._values import (
    KNOWN_MAPPINGS,
    Codec,
    imported_node_class,
    is_struct_class,
    known_mapping,
    unflatten_node,
)


class _NodeError(Exception):
    """A problem with one node; the decoder adds the source and tree path."""


class Resolver:
    """Turns class references into classes, following the loading rules."""

    def __init__(self, load_cls: Any, allow_imports: Iterable[str] | None) -> None:
        self.overrides: dict[str, type] = {}
        self.root_cls: type | None = None
        if isinstance(load_cls, type):
            self.root_cls = load_cls
        elif isinstance(load_cls, Mapping):
            for ref, cls in load_cls.items():
                if not isinstance(ref, str) or not isinstance(cls, type):
                    raise TypeError(
                        "load_cls mapping must map 'module:QualName' strings to classes, "
                        f"got {ref!r}: {cls!r}"
                    )
                self.overrides[ref] = cls
        elif load_cls is not None:
            raise TypeError(
                f"load_cls expected a class or a mapping of references to classes, got {load_cls!r}"
            )
        if isinstance(allow_imports, str):
            allow_imports = (allow_imports,)
        try:
            self.allow = tuple(allow_imports or ())
        except TypeError:
            raise TypeError(f"allow_imports expected module names, got {allow_imports!r}") from None
        for name in self.allow:
            if not isinstance(name, str) or not name:
                raise TypeError(f"allow_imports expected module names, got {name!r}")

    def resolve(self, ref: object, what: str, vouched: type | None = None) -> type:
        """The class ``ref`` names: ``load_cls``, the target's, registered, or allowed."""
        if not isinstance(ref, str):
            raise _NodeError(f"class reference must be a string, got {type(ref).__name__}")
        cls = self.overrides.get(ref) or vouched or lookup_class(ref)
        if cls is None and what in (PYTREE, "stored"):
            cls = imported_node_class(ref)  # registered with JAX by an imported module
        if cls is not None:
            return cls
        module = ref.partition(":")[0]
        if self.allows(module):
            try:
                return resolve_class(ref, allow_import=True)
            except ClassReferenceError as err:
                raise _NodeError(str(err)) from None
        raise _NodeError(
            f"{what} class {ref!r} is not known to this process, and loading never imports "
            "modules on its own. Either (1) import or define the class before loading (Struct "
            "subclasses and registered pytree types are found automatically; other classes via "
            "jaxstruct.registry.register_class_ref), (2) pass target= holding an instance of the "
            "class at this place in the tree (jax.eval_shape of your own constructor; for a model "
            "holding functions, such as an equinox or flax NNX one, a freshly built model or "
            "equinox.filter_eval_shape / flax.nnx.eval_shape of it), (3) pass "
            f"load_cls=TheClass (or load_cls={{{ref!r}: TheClass}}), or (4) if you trust this "
            f"file, allow importing its module with allow_imports=[{module!r}]"
        )

    def allows(self, module: str) -> bool:
        """Whether the user allowed importing ``module`` (``allow_imports``)."""
        return any(module == a or module.startswith(a + ".") for a in self.allow)

    def function(self, ref: str) -> Any:
        """The function ``ref`` (``module:qualname``) names, when the user allowed its module
        with ``allow_imports``; ``None`` otherwise. Only a plain function defined there under
        that name is returned (never a class or another object): nothing is called."""
        module_name, _, qualname = ref.partition(":")
        if not qualname or "<" in qualname or not self.allows(module_name):
            return None
        try:
            obj: Any = importlib.import_module(module_name)
        except Exception:  # the module cannot be imported: refused as if not allowed
            return None
        for part in qualname.split("."):
            obj = inspect.getattr_static(obj, part, None)
            if obj is None:
                return None
        if isinstance(obj, staticmethod):
            obj = obj.__func__
        if not inspect.isfunction(obj) and not inspect.isbuiltin(obj):
            return None
        if obj.__module__ != module_name or obj.__qualname__ != qualname:
            return None
        return obj


def _float(value: object) -> float:
    if type(value) is float:
        return value
    if isinstance(value, str) and len(value) == 16:
        try:
            x = struct.unpack(">d", bytes.fromhex(value))[0]
        except ValueError:
            pass
        else:
            if not math.isfinite(x):
                return x
    raise _NodeError(f"malformed float {clip(repr(value))}")


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _NodeError(f"{what} must be a string, got {type(value).__name__}")
    return value


class _Decoder:
    def __init__(
        self,
        nodes: list[Any],
        meta: Mapping[str, Any],
        arrays: Mapping[str, Any],
        *,
        resolver: Resolver,
        limits: Limits,
        source: str,
        target: TargetMatch | None = None,
        codec_named: Callable[[str], Any] | None = None,
    ) -> None:
        self.nodes = nodes
        # What a restore target vouches for (none without one): see ``TargetMatch``.
        self.classes: dict[int, type] = {} if target is None else target.classes
        self.supplied: dict[int, dict[str, Any]] = {} if target is None else target.supplied
        self.leaves: dict[int, Any] = {} if target is None else target.leaves
        self.unused: set[int] = set() if target is None else target.unused
        self.meta = meta
        self.arrays = arrays
        self.resolver = resolver
        self.limits = limits
        self.source = source
        self.out: list[Any] = []
        self.used = bytearray(len(nodes))
        self.arrays_used: set[str] = set()
        self.placed: dict[str, Any] = {}  # host arrays put on the default device up front
        # Looks codecs up by name (a partial restore keeps some undecoded); the registry's
        # own lookup when None.
        self.codec_named = codec_named

    def place_all(self) -> None:
        """Put every host array that a JAX array or PRNG key node needs on the device at once."""
        keys: dict[str, None] = {}
        for node in self.nodes:
            if (
                type(node) is list
                and ((len(node) == 2 and node[0] == JAXARRAY) or node[:1] == [PRNGKEY])
                and len(node) >= 2
                and type(node[1]) is str
                and node[1] in self.meta
            ):
                arr = self.arrays.get(node[1])
                if type(arr) is np.ndarray and not _too_wide(arr):
                    keys[node[1]] = None
        if len(keys) < 2:
            return
        import jax

        hosts = [self.arrays[k] for k in keys]
        try:
            placed = None
            if all(jax.dtypes.canonicalize_dtype(x.dtype) == x.dtype for x in hosts):
                placed = put_on_default_device(hosts)
            if placed is None:
                placed = jax.device_put(hosts)
        except Exception:  # one array JAX refuses: each node reports its own error
            return
        self.placed = dict(zip(keys, placed, strict=True))

    def skip_ported_static(self) -> None:
        """Leave out the functions in the static data of another library's pytree node whose
        class is a Struct now: that node loads into the struct's own fields, or is refused."""
        for i, node in enumerate(self.nodes):
            if type(node) is list and len(node) >= 4 and node[0] == PYTREE and node[2] == "j":
                ref = node[1]
                cls = self.resolver.overrides.get(ref) if isinstance(ref, str) else None
                cls = cls or self.classes.get(i)
                if cls is None and isinstance(ref, str):
                    cls = lookup_class(ref)
                if cls is not None and is_struct_class(cls):
                    mark_unused(self.nodes, node[3], self.unused)

    def fail(self, index: int, problem: str) -> SerializationError:
        return SerializationError(f"{self.source}: the value at {self.path_of(index)}: {problem}")

    def path_of(self, index: int) -> str:
        parents: dict[int, tuple[int, str]] = {}
        for i, node in enumerate(self.nodes):
            if not isinstance(node, list) or not node:
                continue
            try:
                kids = children(node)
            except (MalformedNode, TypeError):
                continue  # a malformed node: no children to label
            for child in kids:
                if isinstance(child.index, int) and child.index not in parents:
                    parents[child.index] = (i, error_step(self.nodes, child))
        parts: list[str] = []
        while index in parents and len(parts) < 10_000:
            index, label = parents[index]
            parts.append(label)
        if len(parts) >= 10_000:
            return "root...(deep)" + "".join(reversed(parts[:20]))
        return (
            "root" + "".join(reversed(parts)) if index == len(self.nodes) - 1 else f"node {index}"
        )

    def children(self, index: int, items: object) -> list[int]:
        if not isinstance(items, list):
            raise _NodeError(f"expected a list of child indices, got {type(items).__name__}")
        for c in items:
            if type(c) is not int or not 0 <= c < index:
                raise _NodeError(f"child index {clip(repr(c))} does not point to an earlier node")
            if self.used[c]:
                raise _NodeError(f"node {c} is used twice; each node must have one parent")
            self.used[c] = 1
        return items

    def run(self, root: object) -> Any:
        n = len(self.nodes)
        if n == 0 or root != n - 1 or type(root) is not int:
            raise SerializationError(
                f"{self.source}: the manifest root must be the index of the last node"
            )
        if n > self.limits.max_nodes:
            raise SerializationError(
                f"{self.source}: the manifest has {n} nodes, more than max_nodes="
                f"{self.limits.max_nodes}; if you trust this file, pass a larger max_nodes="
            )
        if self.resolver.root_cls is not None:
            node = self.nodes[root]
            if (
                isinstance(node, list)
                and len(node) > 1
                and isinstance(node[0], str)
                and node[0] in CLASS_TAGS
            ):
                if isinstance(node[1], str):
                    self.resolver.overrides.setdefault(node[1], self.resolver.root_cls)
            else:
                raise SerializationError(
                    f"{self.source}: load_cls={self.resolver.root_cls.__qualname__} was given but "
                    "the stored value is not an instance of a class"
                )
        depth = [0] * n
        out = self.out
        max_depth = self.limits.max_depth
        for i, node in enumerate(self.nodes):
            try:
                if not isinstance(node, list) or not node or not isinstance(node[0], str):
                    raise _NodeError("malformed node: expected a list starting with a tag")
                handler = _HANDLERS.get(node[0])
                if handler is None:
                    raise _NodeError(f"unknown node tag {clip(repr(node[0]))}")
                value, kids = handler(self, i, node)
            except _NodeError as err:
                raise self.fail(i, str(err)) from None
            except SerializationError as err:
                raise self.fail(i, str(err)) from err
            except RecursionError:
                raise self.fail(i, "rebuilding it exceeded Python's recursion limit") from None
            except Exception as err:
                raise self.fail(i, f"rebuilding it failed ({type(err).__name__}: {err})") from err
            if kids:
                d = 1 + max(depth[c] for c in kids)
                if d > max_depth:
                    raise SerializationError(
                        f"{self.source}: nesting is deeper than max_depth={max_depth}; if you "
                        "trust this file, pass a larger max_depth="
                    )
                depth[i] = d
            out.append(value)
            # Children are no longer needed once their parent holds them.
            for c in kids:
                out[c] = None
        unused = [i for i in range(n - 1) if not self.used[i]]
        if unused:
            raise SerializationError(
                f"{self.source}: the manifest has node {unused[0]} that no other node references"
            )
        missing = set(self.meta) - self.arrays_used
        if missing:
            raise SerializationError(
                f"{self.source}: the arrays table lists {sorted(missing)[:5]} which the "
                "manifest never references"
            )
        return out[-1]

    def take(self, raw_key: object) -> Any:
        key = _str(raw_key, "array key")
        if key not in self.arrays or key not in self.meta:
            raise _NodeError(f"array {key!r} is not in the arrays table")
        if key in self.arrays_used:
            raise _NodeError(f"array {key!r} is referenced twice")
        self.arrays_used.add(key)
        return self.arrays[key]


def _is_abstract(arr: Any) -> bool:
    """Whether ``arr`` is a ``jax.ShapeDtypeStruct`` (a partial restore's unread array)."""
    abstract = getattr(sys.modules.get("jax"), "ShapeDtypeStruct", None)  # mid-import: none
    return abstract is not None and isinstance(arr, abstract)


def _too_wide(arr: np.ndarray) -> bool:
    """Whether ``arr`` is 64-bit data that JAX would narrow (``jax_enable_x64`` is off)."""
    import jax

    wide = arr.dtype.itemsize == (16 if arr.dtype.kind == "c" else 8)
    return wide and arr.dtype.kind in "iufc" and not jax.config.read("jax_enable_x64")


def _weakly_typed(arr: Any) -> Any:
    """Return ``arr`` as a weakly typed JAX array of the same dtype, or ``None`` if JAX can't."""
    import jax

    out: Any
    if arr.ndim == 0:
        # The public way: a Python scalar becomes a weakly typed array.
        out = jax.numpy.asarray(arr.item())
        if isinstance(arr, jax.Array):
            out = jax.device_put(out, arr.sharding)
    else:
        out = weakly_typed(arr)  # JAX has no public constructor for these
    # The dtype differs only if jax_enable_x64 changed since the export.
    if out is None or out.dtype != arr.dtype or not getattr(out, "weak_type", False):
        return None
    return out


# -- handlers: (decoder, index, node) -> (value, children) ----------------------


def _h_none(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 1:
        raise _NodeError("malformed none node")
    return None, []


def _h_bool(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2 or type(node[1]) is not bool:
        raise _NodeError("malformed bool node")
    return node[1], []


def _h_int(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2:
        raise _NodeError("malformed int node")
    value = node[1]
    if type(value) is int:
        return value, []
    if isinstance(value, str) and len(value) > 2 and value.lstrip("-").startswith("0x"):
        try:
            return int(value, 16), []
        except ValueError:
            pass
    raise _NodeError(f"malformed int {clip(repr(value))}")


def _h_float(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2:
        raise _NodeError("malformed float node")
    return _float(node[1]), []


def _h_complex(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3:
        raise _NodeError("malformed complex node")
    return complex(_float(node[1]), _float(node[2])), []


def _h_str(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2:
        raise _NodeError("malformed str node")
    return _str(node[1], "str value"), []


def _h_bytes(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2:
        raise _NodeError("malformed bytes node")
    try:
        return base64.b64decode(_str(node[1], "bytes value"), validate=True), []
    except (binascii.Error, ValueError):
        raise _NodeError("bytes value is not valid base64") from None


def _h_path(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3 or node[1] not in PATH_TYPES:
        raise _NodeError("malformed path node")
    return PATH_TYPES[node[1]](_str(node[2], "path")), []


def _h_sequence(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2:
        raise _NodeError(f"malformed {node[0]} node")
    kids = d.children(i, node[1])
    return SEQUENCES[node[0]]([d.out[c] for c in kids]), kids


def _h_dict(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2:
        raise _NodeError("malformed dict node")
    kids = d.children(i, node[1])
    if len(kids) % 2:
        raise _NodeError("dict node must list keys and values in pairs")
    out: dict[Any, Any] = {}
    for k, v in zip(kids[::2], kids[1::2], strict=True):
        key = d.out[k]
        try:
            if key in out:
                raise _NodeError(f"dict key {clip(repr(key))} appears twice")
        except TypeError:
            raise _NodeError(f"dict key of type {type(key).__name__} is not hashable") from None
        out[key] = d.out[v]
    return out, kids


def _h_namedtuple(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3:
        raise _NodeError("malformed namedtuple node")
    cls = d.resolver.resolve(node[1], NAMEDTUPLE, d.classes.get(i))
    if not (issubclass(cls, tuple) and hasattr(cls, "_fields") and hasattr(cls, "_make")):
        raise _NodeError(f"{node[1]!r} resolved to {cls!r}, which is not a namedtuple class")
    kids = d.children(i, node[2])
    if len(kids) != len(cls._fields):  # type: ignore[attr-defined]
        raise _NodeError(
            f"namedtuple {cls.__qualname__} has {len(cls._fields)} fields but "  # type: ignore[attr-defined]
            f"{len(kids)} were stored"
        )
    return cls._make(d.out[c] for c in kids), kids  # type: ignore[attr-defined]


def _h_enum(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3:
        raise _NodeError("malformed enum node")
    cls = d.resolver.resolve(node[1], ENUM, d.classes.get(i))
    if not issubclass(cls, enum.Enum):
        raise _NodeError(f"{node[1]!r} resolved to {cls!r}, which is not an Enum")
    name = _str(node[2], "enum member name")
    member = cls.__members__.get(name)
    if member is None and issubclass(cls, enum.Flag):  # a combination: "R|W", or "" for none
        member = cls(0)
        for part in name.split("|") if name else ():
            flag = cls.__members__.get(part)
            if flag is None:
                raise _NodeError(f"flag {cls.__qualname__} has no member {part!r}")
            member |= flag
    if member is None:
        raise _NodeError(f"enum {cls.__qualname__} has no member {name!r}")
    return member, []


def _h_npscalar(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3:
        raise _NodeError("malformed numpy scalar node")
    dtype = parse_dtype(node[1], "numpy scalar")
    try:
        raw = bytes.fromhex(_str(node[2], "scalar bits"))
    except ValueError:
        raise _NodeError("numpy scalar bits are not hex") from None
    if len(raw) != dtype.itemsize:
        raise _NodeError(
            f"numpy scalar of dtype {dtype} needs {dtype.itemsize} bytes, got {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dtype)[0] if dtype.itemsize else np.zeros((), dtype)[()], []


def _h_array(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    want_jax = node[0] == JAXARRAY
    weak = want_jax and len(node) == 3 and node[2] == "weak"
    if len(node) != 2 and not weak:
        raise _NodeError("malformed array node")
    arr = d.take(node[1])
    if not isinstance(arr, np.ndarray):
        # Already placed on devices by a restore target, or left unread by a
        # partial restore (an abstract jax.ShapeDtypeStruct stands in for it,
        # and is kept as it is: the selection finds it by identity).
        if weak and not getattr(arr, "weak_type", True) and not _is_abstract(arr):
            restored = _weakly_typed(arr)  # as weak as it was saved, where it was put
            return (arr if restored is None else restored), []
        return arr, []
    if not want_jax:
        return arr, []
    if not weak and node[1] in d.placed:
        return d.placed[node[1]], []
    if _too_wide(arr):
        raise _NodeError(
            f"it was a 64-bit JAX array ({arr.dtype}) but jax_enable_x64 is off, and loading "
            "never narrows silently; enable it with jax.config.update('jax_enable_x64', True) "
            "before loading"
        )
    if weak:
        restored = _weakly_typed(arr)
        if restored is not None:
            return restored, []
    import jax

    return jax.device_put(arr), []  # an aligned host buffer is adopted without a copy


def _h_prngkey(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3:
        raise _NodeError("malformed prngkey node")
    impl = _str(node[2], "PRNG implementation name")
    data = d.take(node[1])
    data = d.placed.get(node[1], data)
    import jax

    if isinstance(data, jax.ShapeDtypeStruct):
        return data, []  # left unread by a partial restore
    try:
        return jax.random.wrap_key_data(data, impl=impl), []
    except Exception as err:
        raise _NodeError(
            f"cannot rebuild a PRNG key of implementation {impl!r} from data of shape "
            f"{tuple(data.shape)} ({type(err).__name__}: {err})"
        ) from None


def _h_struct(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if (
        len(node) not in (4, 5)
        or type(node[2]) is not int
        or not isinstance(node[3], dict)
        or not all(isinstance(k, str) for k in node[3])
        or (len(node) == 5 and not struct_kinds_ok(node[4], len(node[3])))
    ):
        raise _NodeError("malformed struct node")
    ref, stored_version, fields = node[1], node[2], node[3]
    cls = d.resolver.resolve(ref, STRUCT, d.classes.get(i))
    try:
        spec = resolve_pytree_spec(cls)
    except ClassReferenceError:
        spec = None
    if spec is None or spec.kind != "struct":
        raise _NodeError(f"{ref!r} resolved to {cls!r}, which is not a Struct class")
    kids = d.children(i, list(fields.values()))
    values = {name: d.out[c] for name, c in zip(fields, kids, strict=True)}
    values = _migrate(cls, stored_version, values)
    supplied = d.supplied.get(i)
    if supplied and d.classes.get(i) is cls:
        for name, value in supplied.items():
            values.setdefault(name, value)  # a field not stored: the target's value
    return _build(cls, values, ref), kids


def struct_kinds_ok(kinds: object, count: int) -> bool:
    """Whether ``kinds`` is a struct node's field-kind letters for ``count`` fields."""
    return type(kinds) is str and len(kinds) == count and not kinds.strip("nso")


def _migrate(cls: type, stored: int, values: dict[str, Any]) -> dict[str, Any]:
    current = getattr(cls, "__struct_version__", 0)
    if stored == current:
        return values
    name = cls.__qualname__
    if stored > current:
        raise _NodeError(
            f"it was written by version {stored} of {name}, newer than this code's version "
            f"{current}; load it with the newer code"
        )
    migrate = getattr(cls, "__struct_migrate__", None)
    if migrate is None:
        raise _NodeError(
            f"it was written by version {stored} of {name}, and this code is version {current} "
            f"but defines no __struct_migrate__ classmethod to upgrade it"
        )
    for version in range(stored, current):
        try:
            result = migrate(version, dict(values))
        except Exception as err:
            raise _NodeError(
                f"{name}.__struct_migrate__({version}, ...) failed ({type(err).__name__}: {err})"
            ) from err
        if not isinstance(result, Mapping):
            raise _NodeError(
                f"{name}.__struct_migrate__({version}, ...) must return a mapping of field "
                f"values, got {type(result).__name__}"
            )
        values = dict(result)
    return values


def _build(cls: type, values: dict[str, Any], ref: str) -> Any:
    specs = {f.name: f for f in _struct_fields(cls)}
    unknown = [n for n in values if n not in specs or specs[n].is_derived]
    if unknown:
        raise _NodeError(
            f"stored field(s) {unknown} of {ref!r} are not fields of {cls.__qualname__} (derived "
            "fields are never stored); rename or drop them in a __struct_migrate__ classmethod "
            "(see __struct_version__)"
        )
    missing = [
        n for n, f in specs.items() if not f.is_derived and not f.has_default and n not in values
    ]
    if missing:
        hint = (
            " (not stored because of its serialize= policy; give it a default, give its value in "
            "the restore target (target=), or declare it serialize=True)"
            if any(not specs[n].should_serialize for n in missing)
            else ""
        )
        raise _NodeError(
            f"required field(s) {missing} of {cls.__qualname__} are missing from the stored "
            f"value{hint}; give the field a default, or fill it in a __struct_migrate__ classmethod"
        )
    import jaxstruct.core as js

    return js.build(cls, values)  # no __init__: the stored values, as they were


def _h_pytree(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    named = len(node) == 6 and child_names(node) is not None
    if not (len(node) == 5 or named) or node[2] not in ("s", "a", "j"):
        raise _NodeError("malformed pytree node")
    ref, mode = node[1], node[2]
    cls = d.resolver.resolve(ref, PYTREE, d.classes.get(i))
    if mode == "j":  # a class registered with JAX only, rebuilt by its own unflatten
        spec = None
        if is_registered_pytree_type(cls):
            # Structs and jaxstruct-registered types are rebuilt with their checks
            # (converters, validators, deserializers), never through raw unflatten.
            return _ported(d, i, node, cls, ref)
    else:
        try:
            spec = resolve_pytree_spec(cls)
        except ClassReferenceError:
            spec = None
        if spec is None or spec.kind == "struct":
            raise _NodeError(f"{ref!r} resolved to {cls!r}, which is not a registered pytree type")
    kids = d.children(i, [node[3], *node[4]] if isinstance(node[4], list) else None)
    payload = d.out[kids[0]]
    children = [d.out[c] for c in kids[1:]]
    if spec is None:
        try:
            value = unflatten_node(cls, payload, children)
        except TypeError as err:
            raise _NodeError(str(err)) from None
        if type(value) is not cls:
            raise _NodeError(
                f"the registered unflatten of {ref!r} returned {type(value).__name__}, "
                f"not {cls.__qualname__}"
            )
        return value, kids
    if mode == "s":
        if spec.deserializer is None:
            raise _NodeError(
                f"it was stored with the serializer of {ref!r}, but the class is now registered "
                "without a deserializer; register it with serializer= and deserializer="
            )
        value = spec.deserializer(payload, children)
    else:
        value = spec.unflatten(payload, children)
    if not isinstance(value, cls):
        got, wanted = name_classes(type(value), cls)
        raise _NodeError(f"the deserializer of {ref!r} returned {got}, not {wanted}")
    return value, kids


def _ported(d: _Decoder, i: int, node: list[Any], cls: type, ref: str) -> tuple[Any, list[int]]:
    """A value stored as another library's pytree node (a flax.struct or chex dataclass, an
    equinox Module) whose class is a Struct now: built by the struct's own construction from
    the stored children, matched by field names, when the user vouches for the class."""
    vouched = d.classes.get(i) is cls or d.resolver.overrides.get(ref) is cls
    if not is_struct_class(cls):
        raise _NodeError(
            f"{ref!r} is registered with jaxstruct now, but the file stores it as another "
            "library's pytree node (the class was registered with JAX only when the file was "
            "written), and registered types are rebuilt only by their own deserializer; load "
            "it with the code that wrote it, or make the class a Struct (then target= or "
            "load_cls= loads it by field names)"
        )
    if not vouched:
        raise _NodeError(
            f"{ref!r} is a Struct now, but the file stores it as another library's pytree "
            "node (the class was a flax.struct or chex dataclass, or an equinox Module, when "
            "the file was written); to load it into the struct, matched by field names and "
            "built by its own constructor, pass target= holding an instance of "
            f"{cls.__qualname__} at this place (jax.eval_shape of your constructor) or "
            f"load_cls={{{ref!r}: {cls.__qualname__}}}"
        )
    names = child_names(node)
    if names is None:
        raise _NodeError(
            f"the stored pytree node of {ref!r} names no fields, so it cannot be matched to the "
            f"fields of {cls.__qualname__}"
        )
    kids = d.children(i, [node[3], *node[4]])
    values = {name: d.out[c] for name, c in zip(names, kids[1:], strict=True)}
    for name, value in (d.supplied.get(i) or {}).items():
        values.setdefault(name, value)  # not stored as a child (static then): the target's
    specs = {f.name: f for f in _struct_fields(cls)}
    unknown = [n for n in values if n not in specs or specs[n].is_derived]
    if unknown:
        raise _NodeError(
            f"stored field(s) {unknown} of {ref!r} are not fields of {cls.__qualname__}; give "
            "the struct these fields, or load with the class that wrote the file"
        )
    try:
        value = cls(**values)
    except Exception as err:
        raise _NodeError(
            f"building {cls.__qualname__} from the stored fields {sorted(values)} failed "
            f"({type(err).__name__}: {err}); fields that were static in the old class are not "
            "named in the file: pass target= holding their values"
        ) from err
    return value, kids


def _h_callable(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2:
        raise _NodeError("malformed callable node")
    name = _str(node[1], "callable name")
    if i in d.unused:
        return None, []  # static data of a node loaded into a Struct: never used
    value = d.leaves.get(i)
    if value is None:
        value = d.resolver.function(name)
    if value is None:
        module = name.partition(":")[0]
        raise _NodeError(
            f"it was the function {name!r}, and checkpoints never store code; load with "
            "target= holding the same structure built by your own code (a freshly built "
            "model, or equinox.filter_eval_shape / flax.nnx.eval_shape of your constructor: "
            "jax.eval_shape cannot return one holding functions), and the function at this "
            "place is taken from it"
            + (
                f"; or, if you trust this file, allow the module that defines it with "
                f"allow_imports=[{module!r}]"
                if "<" not in name  # a function defined inside another is never found by name
                else ""
            )
        )
    return value, []


def _h_class(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 2:
        raise _NodeError("malformed class node")
    # The class itself, never instantiated; found as the classes of nodes are.
    return d.resolver.resolve(node[1], "stored", d.classes.get(i)), []


def _h_scalartype(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3 or node[1] not in ("numpy", "jax") or not isinstance(node[2], str):
        raise _NodeError("malformed scalartype node")
    name = node[2]
    if node[1] == "jax":
        import jax.numpy as module
    else:
        module = np
    cls = getattr(module, name, None) if name.isidentifier() and name.islower() else None
    # Only a scalar type of that very dtype (np.float32, jnp.bfloat16), never another name.
    dtype = (
        np.dtype(cls)
        if isinstance(cls, type) and issubclass(cls, np.generic) and node[1] == "numpy"
        else getattr(cls, "dtype", None)
        if isinstance(cls, type) and node[1] == "jax"
        else None
    )
    if not isinstance(dtype, np.dtype) or dtype.name != name:
        raise _NodeError(f"{node[1]} has no scalar type {clip(repr(name))}")
    return cls, []


def _h_mapping(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3 or not isinstance(node[1], str):
        raise _NodeError("malformed mapping node")
    cls = known_mapping(node[1])
    if cls is None:
        raise _NodeError(
            f"mapping class {clip(repr(node[1]))} is not known to this process; loading never "
            "imports modules on its own, so import the library that defines it first"
            if node[1] in KNOWN_MAPPINGS
            else f"mapping class {clip(repr(node[1]))} is not one loading rebuilds"
        )
    kids = d.children(i, [node[2]])
    items = d.out[kids[0]]
    if type(items) is not dict:
        raise _NodeError(f"a mapping node holds a dict, got {type(items).__name__}")
    return cls(items), kids


def _h_codec(d: _Decoder, i: int, node: list[Any]) -> tuple[Any, list[int]]:
    if len(node) != 3:
        raise _NodeError("malformed codec node")
    name = _str(node[1], "codec name")
    registry = current_registry()
    lookup = d.codec_named or registry.codec_named
    codec = lookup(name)  # PluginError if its plugin failed or clashes
    if codec is None:
        more = registry.missing_hint()
        raise _NodeError(
            f"it was stored by codec {name!r}, which is not registered; install the plugin that "
            "provides it (entry-point group 'jaxstruct.io') or register it with "
            f"jaxstruct.io.register_codec(){'; ' + more if more else ''}"
        )
    kids = d.children(i, [node[2]])
    try:
        value = codec.decode(d.out[kids[0]])
    except Exception as err:
        raise _NodeError(
            f"codec {name!r} ({_source(name)}) failed to decode it ({type(err).__name__}: {err})"
        ) from err
    if type(value) not in codec.types:
        raise _NodeError(
            f"codec {name!r} ({_source(name)}) returned {type(value).__name__}, not one of its "
            "declared types; its decode is wrong (report it to the codec's authors)"
        )
    return value, kids


def _source(codec_name: str) -> str:
    """Who registered the codec ``codec_name`` (a plugin and its distribution)."""
    try:
        return current_registry().describe_source("codec", codec_name)
    except (KeyError, StructError):
        return "not registered"


_HANDLERS: dict[str, Callable[[_Decoder, int, list[Any]], tuple[Any, list[int]]]] = {
    NONE: _h_none,
    BOOL: _h_bool,
    INT: _h_int,
    FLOAT: _h_float,
    COMPLEX: _h_complex,
    STR: _h_str,
    BYTES: _h_bytes,
    PATH: _h_path,
    LIST: _h_sequence,
    TUPLE: _h_sequence,
    SET: _h_sequence,
    FROZENSET: _h_sequence,
    DICT: _h_dict,
    NAMEDTUPLE: _h_namedtuple,
    ENUM: _h_enum,
    NPSCALAR: _h_npscalar,
    ARRAY: _h_array,
    JAXARRAY: _h_array,
    PRNGKEY: _h_prngkey,
    STRUCT: _h_struct,
    PYTREE: _h_pytree,
    CALLABLE: _h_callable,
    SCALARTYPE: _h_scalartype,
    CLASS: _h_class,
    MAPPING: _h_mapping,
    CODEC: _h_codec,
}


def decode_state(
    manifest: Mapping[str, Any],
    meta: Mapping[str, Any],
    arrays: Mapping[str, Any],
    *,
    resolver: Resolver,
    limits: Limits,
    source: str,
    target: TargetMatch | None = None,
    codec_named: Callable[[str], Any] | None = None,
) -> Any:
    """Rebuild the value a checked manifest describes."""
    nodes = manifest.get("nodes")
    if not isinstance(nodes, list):
        raise SerializationError(f"{source}: the manifest has no 'nodes' list")
    decoder = _Decoder(
        nodes,
        meta,
        arrays,
        resolver=resolver,
        limits=limits,
        source=source,
        target=target,
        codec_named=codec_named,
    )
    if len(nodes) <= limits.max_nodes:
        decoder.place_all()
        decoder.skip_ported_static()
    value = decoder.run(manifest.get("root"))
    root_cls = resolver.root_cls
    if root_cls is not None and not isinstance(value, root_cls):
        raise SerializationError(
            f"{source}: expected an instance of {class_ref(root_cls)!r} (load_cls), got "
            f"{type(value).__module__}.{type(value).__qualname__}"
        )
    return value


def undecoded_codec(name: str) -> Codec | None:
    """For a partial restore's skeleton: a codec keeping the stored value, undecoded."""
    if current_registry().codec_named(name) is None:
        return None
    _register_stand_in()
    return Codec(name, (CodecStandIn,), encode=lambda v: v, decode=CodecStandIn)


def outside_selection(abstract: list[Any]) -> Callable[[str], Codec | None]:
    """Codecs for the final decode of a partial restore: a codec value holding an array
    that was not read (outside the selection) stays undecoded."""
    import jax

    ids = {id(v) for v in abstract}

    def lookup(name: str) -> Codec | None:
        codec = current_registry().codec_named(name)
        if codec is None:
            return None
        _register_stand_in()

        def decode(stored: Any) -> Any:
            leaves = jax.tree_util.tree_leaves(stored)
            if any(id(leaf) in ids for leaf in leaves):
                return CodecStandIn(stored)
            return codec.decode(stored)

        return Codec(name, (*codec.types, CodecStandIn), codec.encode, decode)

    return lookup


class CodecStandIn:
    """A codec value in a partial restore's skeleton: the value as stored, not yet decoded."""

    def __init__(self, stored: Any) -> None:
        self.stored = stored


@functools.cache
def _register_stand_in() -> None:
    import jax

    jax.tree_util.register_pytree_node(
        CodecStandIn, lambda s: ((s.stored,), None), lambda _, kids: CodecStandIn(kids[0])
    )


def _struct_fields(cls: type) -> list[Any]:
    """The ``FieldSpec`` objects of a Struct class, in declaration order."""
    import jaxstruct.core as js

    return list(js.fields(cls).values())
