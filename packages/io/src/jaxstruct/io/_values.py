"""Values beyond plain pytrees: codecs, struct classes, other libraries' pytree nodes."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


@dataclasses.dataclass(frozen=True)
class Codec:
    """A named pair of functions storing values of some exact types.

    ``encode`` turns a value into anything ``jaxstruct.io`` can store (plain
    JSON values, containers, arrays, other codec values); ``decode`` receives
    that stored value back and returns the original. The manifest records only
    ``name``; loading looks it up among registered codecs and never imports a
    module.

    Attributes:
        name: unique registration name recorded in manifests.
        types: the exact classes handled (subclasses are not matched, so
            nothing changes type silently).
        encode: ``value -> storable``.
        decode: ``storable -> value``.

    Example:
        >>> import fractions
        >>> codec = Codec(
        ...     "fraction",
        ...     (fractions.Fraction,),
        ...     encode=lambda f: (f.numerator, f.denominator),
        ...     decode=lambda pair: fractions.Fraction(*pair),
        ... )
        >>> codec.decode(codec.encode(fractions.Fraction(3, 4)))
        Fraction(3, 4)
    """

    name: str
    types: tuple[type, ...]
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise TypeError(
                f"Codec name must match {_NAME.pattern!r} (letters, digits, '_', '.', '-'), "
                f"got {self.name!r}"
            )
        types = tuple(self.types) if not isinstance(self.types, type) else (self.types,)
        if not types or not all(isinstance(t, type) for t in types):
            raise TypeError(f"Codec {self.name!r}: types must be a non-empty tuple of classes")
        object.__setattr__(self, "types", types)
        if not callable(self.encode) or not callable(self.decode):
            raise TypeError(f"Codec {self.name!r}: encode and decode must be callable")


def is_struct_class(cls: type) -> bool:
    """Whether ``cls`` is a Struct class (registered as one; core is not imported)."""
    from jaxstruct.registry import is_registered_pytree_type, resolve_pytree_spec

    return is_registered_pytree_type(cls) and resolve_pytree_spec(cls).kind == "struct"


def flatten_named(value: Any) -> tuple[list[Any], Any, list[str] | None] | None:
    """``(children, aux data, child names)`` of a JAX pytree node, or ``None`` for a leaf; the
    names are its children's key-path steps, ``None`` when every step is a position anyway."""
    import jax

    keyed, treedef = jax.tree_util.tree_flatten_with_path(value, is_leaf=lambda x: x is not value)
    data = treedef.node_data()  # None for a leaf (a node without children is no leaf)
    if data is None or data[0] is not type(value):  # a subclass flattened as its base
        return None
    named = False
    names = []
    for path, _ in keyed:
        key: Any = path[0] if len(path) == 1 else None
        if isinstance(key, jax.tree_util.GetAttrKey):
            names.append(key.name)
            named = True
        elif isinstance(key, jax.tree_util.DictKey) and isinstance(key.key, (str, int)):
            names.append(str(key.key))
            named = True
        else:
            names.append(str(len(names)))
    return [child for _, child in keyed], data[1], (names if named else None)


def unflatten_node(cls: type, aux: Any, children: Sequence[Any]) -> Any:
    """Rebuild an instance of ``cls`` through its JAX-registered unflatten."""
    import jax

    make = getattr(jax.tree_util.PyTreeDef, "from_node_data_and_children", None)
    if make is None:  # older JAX releases (the declared floors among them)
        raise TypeError(
            f"JAX {jax.__version__} cannot rebuild {cls.__qualname__}, a class registered with "
            "JAX only, from its stored parts (its PyTreeDef has no "
            "from_node_data_and_children); load it with a newer JAX, or store it as a Struct or "
            "through register_pytree_type()"
        )
    leaf = jax.tree_util.tree_structure(0)
    try:
        treedef = make(jax.tree_util.default_registry, (cls, aux), [leaf] * len(children))
    except (ValueError, TypeError, RuntimeError) as err:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} is not registered as a pytree node with "
            f"JAX in this process ({err})"
        ) from None
    return treedef.unflatten(list(children))


def imported_node_class(ref: str) -> type | None:
    """The JAX pytree node class ``ref`` names in an already imported module, else ``None``."""
    module_name, _, qualname = ref.partition(":")
    module = sys.modules.get(module_name)
    if module is None or not qualname or "<" in qualname:
        return None
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if not isinstance(obj, type) or obj.__module__ != module_name:
        return None
    import jax

    make = getattr(jax.tree_util.PyTreeDef, "from_node_data_and_children", None)
    if make is None:  # older JAX: such nodes cannot be rebuilt (see unflatten_node)
        return None
    try:  # registered as a pytree node with JAX? (tried with no children)
        make(jax.tree_util.default_registry, (obj, None), [])
    except (ValueError, TypeError, RuntimeError):  # RuntimeError: an unregistered type
        return None
    return obj


#: Immutable mapping classes of other libraries that a pytree node's static data may hold
#: (flax NNX modules keep a ``HashableMapping``), rebuilt from a dict by their own class:
#: ``"module:QualName"`` of each, found only in a module already imported.
KNOWN_MAPPINGS = ("flax.typing:HashableMapping",)


def known_mapping_ref(cls: type) -> str | None:
    """The reference of ``cls`` when it is one of :data:`KNOWN_MAPPINGS`, else ``None``."""
    ref = f"{cls.__module__}:{cls.__qualname__}"
    return ref if ref in KNOWN_MAPPINGS and known_mapping(ref) is cls else None


def known_mapping(ref: str) -> type | None:
    """The class of one of :data:`KNOWN_MAPPINGS`, if its module is imported (never imports)."""
    if ref not in KNOWN_MAPPINGS:
        return None
    module_name, _, qualname = ref.partition(":")
    cls = getattr(sys.modules.get(module_name), qualname, None)
    return cls if isinstance(cls, type) else None
