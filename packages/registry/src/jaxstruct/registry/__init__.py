"""Portable class references and pytree-type registration, the lowest jaxstruct layer."""

from ._errors import ClassReferenceError, RegistrationError, SerializationError, StructError
from ._pytree import (
    PytreeSpec,
    add_registration_listener,
    add_spec,
    is_registered_pytree_type,
    register_attrs_type,
    register_pytree_type,
    registered_pytree_types,
    resolve_pytree_spec,
)
from ._refs import class_ref, lookup_class, name_classes, register_class_ref, resolve_class

__all__ = [
    "ClassReferenceError",
    "PytreeSpec",
    "RegistrationError",
    "SerializationError",
    "StructError",
    "add_registration_listener",
    "add_spec",
    "class_ref",
    "is_registered_pytree_type",
    "lookup_class",
    "name_classes",
    "register_attrs_type",
    "register_class_ref",
    "register_pytree_type",
    "registered_pytree_types",
    "resolve_class",
    "resolve_pytree_spec",
]
