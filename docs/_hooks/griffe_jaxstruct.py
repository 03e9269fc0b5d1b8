"""Griffe extension used by the docs build: our docstrings, rendered as mkdocstrings expects.

The package docstrings are Google style with two habits mkdocstrings does not
read on its own; they are translated while the API is loaded, so the sources
stay as they are:

* an ``Example:`` section (singular) becomes an ``Examples:`` section, so its
  ``>>>`` lines render as a Python code block instead of a paragraph;
* a reST literal block (``text::`` then an indented block) loses its ``::``:
  Markdown shows the indented block as code already;
* Sphinx roles (``:func:`field```, ``:class:`~jaxstruct.core.Struct```,
  ``:meth:`replace```) become mkdocstrings cross-references
  (``[`field`][jaxstruct.core.field]``) to the name's page in the API reference.
  A role naming something the reference does not document stays inline code.

It also keeps a typing-only redeclaration (``if TYPE_CHECKING:`` in a class body,
e.g. ``Struct.replace``'s signature for pyright) from hiding the documented
runtime method of the same name.

Loaded from ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import importlib
import re
import types
from typing import Any

import griffe

LAYERS = ("registry", "core", "io", "abc", "testing", "orbax", "safetensors")
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|data|exc|mod|obj|const):`(~?)([^`<>]+)`")
EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)
# reST's "text::" before an indented literal block; Markdown needs only the indent.
LITERAL = re.compile(r"(\S)::\n(\s*\n)")


def _public_names() -> tuple[dict[str, str], dict[int, str]]:
    """Map each public name, and each public object, to its path in the API reference.

    An object re-exported by a higher layer (``jaxstruct.core.SerializationError``)
    is documented where it is defined (``jaxstruct.registry.SerializationError``).
    """
    by_name: dict[str, str] = {}
    by_id: dict[int, str] = {}
    for layer in LAYERS:
        package_name = f"jaxstruct.{layer}"
        try:
            package = importlib.import_module(package_name)
        except ImportError:
            continue
        by_name.setdefault(package_name, package_name)
        for name in getattr(package, "__all__", ()):
            obj = getattr(package, name)
            home = _home_layer(obj) or package_name
            path = f"{home}.{name}"
            if isinstance(obj, types.ModuleType):
                path = obj.__name__
            by_name.setdefault(name, path)
            by_name.setdefault(f"{package_name}.{name}", path)
            if not isinstance(obj, str | int | float | bool | tuple | type(None)):
                by_id.setdefault(id(obj), path)
    return by_name, by_id


def _home_layer(obj: Any) -> str | None:
    module = getattr(obj, "__module__", None)
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
    if not isinstance(module, str):
        return None
    for layer in LAYERS:
        package_name = f"jaxstruct.{layer}"
        if module == package_name or module.startswith(package_name + "."):
            return package_name
    return None


class JaxstructDocstrings(griffe.Extension):
    """Rewrite ``Example:`` sections and Sphinx roles before mkdocstrings parses docstrings."""

    def __init__(self) -> None:
        self._by_name, self._by_id = _public_names()
        self._hidden: dict[tuple[str, str], griffe.Object] = {}

    def on_node(self, *, node: Any, agent: Any, **kwargs: Any) -> None:
        """Remember a runtime member that a ``TYPE_CHECKING`` declaration is about to replace."""
        name = getattr(node, "name", None)
        current = getattr(agent, "current", None)
        if not getattr(agent, "type_guarded", False) or name is None or current is None:
            return
        member = current.members.get(name)
        if member is not None and not member.is_alias and member.runtime:
            self._hidden[(current.path, name)] = member

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Put the remembered runtime member back in place of its typing-only twin."""
        parent = obj.parent
        if obj.runtime or parent is None:
            return
        member = self._hidden.pop((parent.path, obj.name), None)
        if member is not None:
            parent.set_member(obj.name, member)

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Translate one object's docstring (every module, class, function, attribute)."""
        docstring = obj.docstring
        if docstring is None:
            return
        value = EXAMPLE.sub(r"\1Examples:", docstring.value)
        value = LITERAL.sub(r"\1:\n\2", value)
        value = ROLE.sub(
            lambda m: self._link(obj, m.group(2).strip(), short=bool(m.group(1))), value
        )
        docstring.value = value

    def _link(self, obj: griffe.Object, target: str, *, short: bool) -> str:
        shown = target.rsplit(".", 1)[-1] if short else target
        path = self._resolve(obj, target)
        if path is None:
            return f"`{shown}`"
        return f"[`{shown}`][{path}]"

    def _resolve(self, obj: griffe.Object, target: str) -> str | None:
        """The reference path of ``target`` as written in ``obj``'s docstring, or None."""
        if target in self._by_name:
            return self._by_name[target]
        head, _, rest = target.partition(".")
        if rest and head in self._by_name:
            # Class.member: the member is documented under its class.
            return f"{self._by_name[head]}.{rest}"
        if target.startswith("jaxstruct."):
            return self._resolve_dotted(target)
        # A member of the enclosing class (``:meth:`replace``` inside Struct).
        owner: Any = obj
        while owner is not None and not owner.is_class:
            owner = owner.parent
        if owner is not None and target in owner.all_members:
            owner_path = self._public_path(owner)
            if owner_path is not None:
                return f"{owner_path}.{target}"
        return None

    def _resolve_dotted(self, target: str) -> str | None:
        parts = target.split(".")
        for cut in range(len(parts), 1, -1):
            prefix = ".".join(parts[:cut])
            if prefix in self._by_name:
                return ".".join([self._by_name[prefix], *parts[cut:]])
        return None

    def _public_path(self, cls: griffe.Object) -> str | None:
        try:
            module = importlib.import_module(cls.module.path)
        except ImportError:
            return None
        runtime = module
        for part in cls.path[len(cls.module.path) + 1 :].split("."):
            runtime = getattr(runtime, part, None)
            if runtime is None:
                return None
        return self._by_id.get(id(runtime))
