"""Abstract struct bases: ``StructABCMeta``, ``AbstractVar`` and ``AbstractClassVar``.

Importing this package teaches ``jaxstruct.core`` about abstract vars and the
``abstract=True`` class keyword. ``__check_init__`` invariants are part of
``jaxstruct.core`` itself and work on every struct class.
"""

from ._abstract import install as _install
from ._abstract import is_abstract
from ._markers import AbstractClassVar, AbstractVar
from ._meta import StructABCMeta

_install()

__all__ = ["AbstractClassVar", "AbstractVar", "StructABCMeta", "is_abstract"]
