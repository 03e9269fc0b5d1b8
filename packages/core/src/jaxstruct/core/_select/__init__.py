"""Functional selection and editing of nested pytrees (see README.md for the design)."""

from ._api import select, tree_at
from ._selection import Selection
from ._tree import SelectionError, SelectionHole

__all__ = ["Selection", "SelectionError", "SelectionHole", "select", "tree_at"]
