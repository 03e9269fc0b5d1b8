"""Error types shared by every jaxstruct layer.

They live in the lowest layer so that each higher layer can raise and catch the
same classes; ``jaxstruct.core`` re-exports them.
"""

from __future__ import annotations

__all__ = [
    "ClassReferenceError",
    "RegistrationError",
    "SerializationError",
    "StructError",
]


class StructError(Exception):
    """Base class of every error raised by jaxstruct."""


class SerializationError(StructError, ValueError):
    """A value cannot be written, or a payload or file cannot be read back."""


class ClassReferenceError(StructError, LookupError):
    """A ``"module:QualName"`` class reference is malformed or cannot be resolved."""


class RegistrationError(StructError, TypeError):
    """A class cannot be registered as a pytree type (bad arguments or a conflict)."""


class _MalformedReferenceError(ClassReferenceError, ValueError):
    """The reference string does not have the ``"module:QualName"`` shape."""


class _MissingModuleError(ClassReferenceError, ImportError):
    """The module part of a reference cannot be imported."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        # LookupError precedes ImportError in the MRO, and its __init__ rejects
        # ImportError's name= keyword; set the attribute ourselves.
        super().__init__(message)
        self.name = name


class _MissingAttributeError(ClassReferenceError, AttributeError):
    """The module exists but has no object at the qualified name."""


class _NotAClassError(ClassReferenceError, TypeError):
    """The reference names an object that is not a class."""
