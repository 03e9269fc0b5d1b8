"""Class references: class_ref and resolve_class."""

from __future__ import annotations

import collections
import itertools
import sys
import textwrap
from pathlib import Path

import jaxstruct.registry as reg
import pytest

_names = itertools.count()


def _write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    name = f"_jaxstruct_refmod_{next(_names)}_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


class Local:
    class Inner:
        pass


# -- class_ref -----------------------------------------------------------------------


def test_class_ref_format() -> None:
    """class_ref gives "module:QualName"."""
    assert reg.class_ref(collections.OrderedDict) == "collections:OrderedDict"


def test_class_ref_nested_class_uses_qualname() -> None:
    """A nested class's reference uses its dotted qualified name."""
    assert reg.class_ref(Local.Inner) == f"{__name__}:Local.Inner"


def test_class_ref_of_non_class_is_type_error() -> None:
    """class_ref of an instance raises TypeError saying what it got."""
    with pytest.raises(TypeError, match="expected a class"):
        reg.class_ref(3)  # type: ignore[arg-type]


def test_class_ref_resolves_back() -> None:
    """resolve_class(class_ref(cls)) is cls."""
    assert reg.resolve_class(reg.class_ref(Local.Inner)) is Local.Inner


# -- resolve_class -------------------------------------------------------------------


def test_resolve_builtin_module_class() -> None:
    """resolve_class imports a module and returns the class."""
    assert reg.resolve_class("collections:OrderedDict") is collections.OrderedDict


def test_resolve_imports_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module is imported only when one of its references is resolved."""
    name = _write_module(tmp_path, monkeypatch, "class Thing:\n    pass\n")
    assert name not in sys.modules
    cls = reg.resolve_class(f"{name}:Thing")
    assert name in sys.modules and cls is sys.modules[name].Thing


def test_resolve_caches_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolved reference is cached: later calls return it without importing again."""
    name = _write_module(tmp_path, monkeypatch, "class Thing:\n    pass\n")
    first = reg.resolve_class(f"{name}:Thing")
    del sys.modules[name]
    (tmp_path / f"{name}.py").unlink()
    assert reg.resolve_class(f"{name}:Thing") is first
    assert reg.lookup_class(f"{name}:Thing") is first


def test_resolve_prefers_in_process_cache() -> None:
    """A class registered under a reference resolves without any import."""

    class Defined:
        pass

    reg.register_class_ref(Defined, "nowhere_importable_pkg.mod:Defined")
    assert reg.resolve_class("nowhere_importable_pkg.mod:Defined") is Defined


def test_resolve_without_import_permission() -> None:
    """allow_import=False refuses to import an unknown module."""
    with pytest.raises(reg.ClassReferenceError, match="not allowed"):
        reg.resolve_class("json.decoder:JSONDecoder", allow_import=False)


@pytest.mark.parametrize("ref", ["NoColon", "a:b:c", "mod:", ":Cls", "1mod:Cls", "a b:C", ""])
def test_malformed_reference(ref: str) -> None:
    """A malformed reference raises ClassReferenceError (and ValueError) naming it."""
    with pytest.raises(reg.ClassReferenceError, match="malformed") as info:
        reg.resolve_class(ref)
    assert isinstance(info.value, ValueError)


def test_non_string_reference_is_malformed() -> None:
    """A non-string reference is reported as malformed."""
    with pytest.raises(reg.ClassReferenceError):
        reg.resolve_class(42)  # type: ignore[arg-type]


def test_missing_module() -> None:
    """A missing module raises ClassReferenceError (and ImportError) naming the module."""
    with pytest.raises(reg.ClassReferenceError, match="'no_such_module_xyz'") as info:
        reg.resolve_class("no_such_module_xyz:Thing")
    assert isinstance(info.value, ImportError)
    assert info.value.name == "no_such_module_xyz"  # type: ignore[attr-defined]


def test_missing_module_error_chains_the_import_error() -> None:
    """The original ImportError is chained as the cause."""
    with pytest.raises(reg.ClassReferenceError) as info:
        reg.resolve_class("no_such_module_xyz:Thing")
    assert isinstance(info.value.__cause__, ImportError)


def test_missing_attribute() -> None:
    """A missing attribute raises ClassReferenceError (and AttributeError) naming it."""
    with pytest.raises(reg.ClassReferenceError, match="'Nope'") as info:
        reg.resolve_class("collections:Nope")
    assert isinstance(info.value, AttributeError)


def test_missing_nested_attribute() -> None:
    """A missing part of a dotted qualified name is reported."""
    with pytest.raises(reg.ClassReferenceError, match=r"OrderedDict\.Nope"):
        reg.resolve_class("collections:OrderedDict.Nope")


def test_not_a_class() -> None:
    """A reference to a function raises ClassReferenceError (and TypeError)."""
    with pytest.raises(reg.ClassReferenceError, match="expected a class, got function") as info:
        reg.resolve_class("os.path:join")
    assert isinstance(info.value, TypeError)


def test_class_reference_error_is_struct_error() -> None:
    """ClassReferenceError is a StructError and a LookupError."""
    assert issubclass(reg.ClassReferenceError, reg.StructError)
    assert issubclass(reg.ClassReferenceError, LookupError)


def test_serialization_error_is_struct_error() -> None:
    """SerializationError is a StructError and a ValueError."""
    assert issubclass(reg.SerializationError, reg.StructError)
    assert issubclass(reg.SerializationError, ValueError)


def test_lookup_class_never_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lookup_class returns None for an unresolved reference without importing its module."""
    name = _write_module(tmp_path, monkeypatch, "class Thing:\n    pass\n")
    assert reg.lookup_class(f"{name}:Thing") is None
    assert name not in sys.modules


def test_struct_classes_enter_cache_at_definition() -> None:
    """A Struct subclass is resolvable (cached) as soon as it is defined."""
    import jaxstruct.core as js

    class Defined(js.Struct):
        x: int = 0

    ref = reg.class_ref(Defined)
    assert "<locals>" in ref
    assert reg.lookup_class(ref) is Defined
    assert reg.resolve_class(ref) is Defined


def test_redefinition_replaces_cached_class() -> None:
    """Registering a new class under the same reference replaces the old one."""

    class First:
        pass

    class Second:
        pass

    reg.register_class_ref(First, "example_pkg:Same")
    reg.register_class_ref(Second, "example_pkg:Same")
    assert reg.resolve_class("example_pkg:Same") is Second


def test_core_reexports_registry_names() -> None:
    """jaxstruct.core re-exports the registry API."""
    import jaxstruct.core as js

    for name in (
        "class_ref",
        "resolve_class",
        "register_pytree_type",
        "register_attrs_type",
        "is_registered_pytree_type",
        "resolve_pytree_spec",
        "StructError",
        "SerializationError",
    ):
        assert getattr(js, name) is getattr(reg, name)
