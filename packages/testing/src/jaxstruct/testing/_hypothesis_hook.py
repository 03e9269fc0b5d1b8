"""The ``hypothesis`` entry point: ``st.from_type(MyStruct)`` works for every struct class.

Hypothesis resolves a registered type's *subclasses*, never the other way
round, so registering ``Struct`` alone would not help: every concrete struct
class is registered, the existing ones at once and new ones as they are
created. Abstract classes are left out, so ``from_type(AbstractBase)`` draws
from the registered concrete subclasses. Classes made by ``struct_classes()``
are left out too (they would pile up in Hypothesis's global table).

Hypothesis is imported by many test suites that never use jaxstruct. So the
hook does not import JAX: when ``jaxstruct.core`` is not imported yet, it
waits for that import (a one-shot meta path finder) and registers then.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

from ._abstract import is_abstract_class

__all__ = ["register_existing", "register_struct", "setup_hypothesis"]

_CORE = "jaxstruct.core"


def register_struct(cls: type) -> None:
    """Register ``cls`` with Hypothesis's ``from_type`` (not abstract or generated classes)."""
    if is_abstract_class(cls) or cls.__dict__.get("__jaxstruct_generated__", False):
        return
    import jaxstruct.core as js  # imported already: this runs as its class hook

    if not js.is_struct(cls):
        return
    from hypothesis import strategies as st

    st.register_type_strategy(cls, _resolve)


def _resolve(cls: type) -> Any:
    # Imported on use: this hook may run while ._strategies is itself being
    # imported (it imports hypothesis, whose import runs this entry point).
    from ._strategies import nested_structs

    return nested_structs(cls)


def register_existing() -> None:
    """Register every struct class defined so far and every one defined from now on."""
    # jaxstruct.abc first: its hook must mark abstract-var classes abstract
    # (and reject broken ones) before this module's hook registers them.
    import jaxstruct.abc  # noqa: F401
    from jaxstruct.core import Struct, extend

    extend.add_class_hook(register_struct)
    stack: list[type] = [Struct]
    seen: set[type] = set()
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                register_struct(sub)


class _AfterCoreImport(importlib.abc.MetaPathFinder):
    """Runs ``register_existing`` right after ``jaxstruct.core`` is first imported."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _CORE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module  # type: ignore[union-attr]

        def run(module: types.ModuleType) -> None:
            exec_module(module)
            register_existing()

        spec.loader = _Loader(loader, run)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, run: Any) -> None:
        self._inner = inner
        self._run = run

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._run(module)


def setup_hypothesis() -> None:
    """Entry point called by ``import hypothesis``: make ``st.from_type`` know struct classes."""
    if _CORE in sys.modules:
        register_existing()
    elif not any(isinstance(f, _AfterCoreImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterCoreImport())
