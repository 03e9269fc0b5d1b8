"""Portable class references: ``"module.path:QualName"`` strings.

Resolution order: the in-process cache, then (if allowed) a lazy import, whose
result is cached too. Struct classes and registered pytree types enter the
cache when they are defined or registered, so a process that defined a class
never needs to import anything to resolve it.
"""

from __future__ import annotations

import importlib
import re
import threading

from ._errors import (
    _MalformedReferenceError,
    _MissingAttributeError,
    _MissingModuleError,
    _NotAClassError,
)

__all__ = ["class_ref", "lookup_class", "name_classes", "register_class_ref", "resolve_class"]

_REF_SHAPE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
    r":[A-Za-z_<][A-Za-z0-9_<>]*(\.[A-Za-z_<][A-Za-z0-9_<>]*)*$"
)

_cache: dict[str, type] = {}
_lock = threading.Lock()


def class_ref(cls: type) -> str:
    """Return the portable reference ``"module:QualName"`` of ``cls``.

    A class registered under another name (``register_class(name=...)``) reports
    that name.

    Args:
        cls: any class.

    Returns:
        The reference string stored in manifests.

    Raises:
        TypeError: if ``cls`` is not a class.

    Example:
        >>> from collections import OrderedDict
        >>> class_ref(OrderedDict)
        'collections:OrderedDict'
    """
    if not isinstance(cls, type):
        raise TypeError(f"class_ref() expected a class, got {type(cls).__name__} {cls!r}")
    ref = cls.__dict__.get("__jaxstruct_ref__")
    if ref is not None:
        return ref
    return f"{cls.__module__}:{cls.__qualname__}"


def name_classes(*classes: type) -> tuple[str, ...]:
    """Return a name for each class that tells it apart from the others, for a message.

    A class is named by its ``__qualname__`` (``State``) unless another class
    given has the same one; those are named by their :func:`class_ref`
    (``algo.es:State``, ``algo.ga:State``). Two different classes with the
    same reference (a module reloaded, a class statement run again) get the
    same name: compare them with ``is``.

    Args:
        classes: the classes one message names.

    Returns:
        One name per class, in the order given.

    Raises:
        TypeError: if one of ``classes`` is not a class.

    Example:
        >>> import types
        >>> es, ga = types.ModuleType("algo.es"), types.ModuleType("algo.ga")
        >>> exec("class State: ...", es.__dict__)
        >>> exec("class State: ...", ga.__dict__)
        >>> name_classes(es.State, ga.State)
        ('algo.es:State', 'algo.ga:State')
        >>> name_classes(es.State, int)
        ('State', 'int')
    """
    for cls in classes:
        if not isinstance(cls, type):
            raise TypeError(f"name_classes() expected classes, got {type(cls).__name__} {cls!r}")
    owners: dict[str, set[int]] = {}
    for cls in classes:
        owners.setdefault(cls.__qualname__, set()).add(id(cls))
    return tuple(
        cls.__qualname__ if len(owners[cls.__qualname__]) == 1 else class_ref(cls)
        for cls in classes
    )


def register_class_ref(cls: type, ref: str | None = None) -> str:
    """Put ``cls`` in the in-process cache under ``ref`` (default: its own reference).

    Later definitions under the same reference replace earlier ones, as when a
    notebook cell is run again.

    Example:
        >>> class Local: ...
        >>> register_class_ref(Local, "example:Local")
        'example:Local'
        >>> resolve_class("example:Local") is Local
        True
    """
    ref = class_ref(cls) if ref is None else ref
    _check_shape(ref)
    with _lock:
        _cache[ref] = cls
    return ref


def lookup_class(ref: str) -> type | None:
    """Return the class cached under ``ref``, or ``None``; never imports anything.

    Example:
        >>> lookup_class("nowhere.at_all:Missing") is None
        True
    """
    return _cache.get(ref)


def _check_shape(ref: object) -> None:
    if not isinstance(ref, str) or not _REF_SHAPE.match(ref):
        raise _MalformedReferenceError(
            f"malformed class reference {ref!r}: expected the form 'package.module:QualName', "
            "for example 'mypkg.models:TrainState'"
        )


def resolve_class(ref: str, *, allow_import: bool = True) -> type:
    """Return the class a ``"module:QualName"`` reference points to.

    Looks in the in-process cache first; otherwise imports the module (only when
    ``allow_import`` is true), walks the qualified name, and caches the result.

    Args:
        ref: the reference, as produced by :func:`class_ref`.
        allow_import: whether a module may be imported to find the class.

    Returns:
        The class.

    Raises:
        ClassReferenceError: the reference is malformed (also a ``ValueError``),
            its module cannot be imported or importing is not allowed (also an
            ``ImportError``), the module has no such attribute (also an
            ``AttributeError``), or the object is not a class (also a ``TypeError``).

    Example:
        >>> resolve_class("collections:OrderedDict")
        <class 'collections.OrderedDict'>
    """
    cls = _cache.get(ref) if isinstance(ref, str) else None
    if cls is not None:
        return cls
    _check_shape(ref)
    module_name, _, qualname = ref.partition(":")
    if not allow_import:
        raise _MissingModuleError(
            f"class {ref!r} is not registered in this process and importing {module_name!r} "
            "is not allowed; import or define the class first, or allow the import",
            name=module_name,
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise _MissingModuleError(
            f"cannot resolve class {ref!r}: module {module_name!r} cannot be imported ({err}); "
            "install the package that defines it or fix the reference",
            name=module_name,
        ) from err
    # Importing may have defined (and so registered) the class under a custom name.
    cls = _cache.get(ref)
    if cls is not None:
        return cls
    obj: object = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _MissingAttributeError(
                f"cannot resolve class {ref!r}: module {module_name!r} has no attribute "
                f"{qualname!r}; check the class name or import the module that defines it"
            ) from None
    if not isinstance(obj, type):
        raise _NotAClassError(
            f"cannot resolve class {ref!r}: expected a class, got {type(obj).__name__}"
        )
    with _lock:
        _cache.setdefault(ref, obj)
    return obj
