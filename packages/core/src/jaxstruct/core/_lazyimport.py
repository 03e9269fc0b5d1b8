"""Run code the moment an optional module finishes importing, without importing it ourselves.

Used to register struct classes with optional libraries (optree, flax's
serialization registry) only when the user's program imports them: defining
a class stays as cheap as before, and the order of imports does not matter.
A one-shot ``sys.meta_path`` entry notices the first import of a watched
module, lets the real finder and loader do the work, then runs the callbacks
on the fully executed module.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]

_lock = threading.RLock()
#: Module name -> callbacks waiting for its import.
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` is imported: at once if it already is.

    A module blocked in ``sys.modules`` (set to ``None``) is never imported, so
    nothing is called for it.
    """
    if name in sys.modules:
        module = sys.modules[name]
        if module is not None:
            callback(module)
        return
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if _watcher not in sys.meta_path:
            sys.meta_path.insert(0, _watcher)


class _Loader(importlib.abc.Loader):
    """Runs the real loader of a watched module, then its callbacks."""

    def __init__(self, inner: Any, callbacks: list[Callable[[ModuleType], None]]) -> None:
        self._inner = inner
        self._callbacks = callbacks

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        for callback in self._callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """The ``sys.meta_path`` entry noticing the first import of each watched module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _pending:  # every other import: one dict lookup
            return None
        with _lock:
            callbacks = _pending.pop(fullname, None)
            if not _pending:
                _remove_watcher()
        if callbacks is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, callbacks)
        return spec


_watcher = _ImportWatcher()


def _remove_watcher() -> None:
    try:
        sys.meta_path.remove(_watcher)
    except ValueError:
        pass
