"""Frozen, JAX-native ``Struct`` containers: fields, lifecycle, replace and introspection.

The everyday import is ``import jaxstruct.core as js``; the registry API is
re-exported here.
"""

from jaxstruct.registry import (
    ClassReferenceError,
    PytreeSpec,
    RegistrationError,
    SerializationError,
    StructError,
    class_ref,
    is_registered_pytree_type,
    lookup_class,
    register_attrs_type,
    register_pytree_type,
    resolve_class,
    resolve_pytree_spec,
)

from . import (
    _flax,  # noqa: F401  (registers struct classes with flax.serialization)
    constraints,
)
from ._compare import tree_equal
from ._errors import (
    FrozenStructError,
    MissingDistributionError,
    Refusal,
    StructDefinitionError,
    TracedCheckError,
    TracedComparisonError,
    UnassignedFieldError,
    ValidationError,
    refusal_of,
)
from ._explain import Change, Recompile, explain_recompiles
from ._fields import MISSING, FieldKind, FieldSpec, field
from ._introspect import (
    build,
    derived_fields,
    fields,
    has_custom_init,
    is_struct,
    node_fields,
    opaque_fields,
    static_fields,
)
from ._meta import StructMeta, class_options
from ._optree import optree_namespace, set_optree_namespace
from ._register import dataclass, register_class
from ._repr import get_printoptions, pformat, printoptions, set_printoptions
from ._select import Selection, SelectionError, SelectionHole, select, tree_at
from ._struct import Struct
from ._typecheck import check_types

__all__ = [
    "MISSING",
    "Change",
    "ClassReferenceError",
    "FieldKind",
    "FieldSpec",
    "FrozenStructError",
    "MissingDistributionError",
    "PytreeSpec",
    "Recompile",
    "Refusal",
    "RegistrationError",
    "Selection",
    "SelectionError",
    "SelectionHole",
    "SerializationError",
    "Struct",
    "StructDefinitionError",
    "StructError",
    "StructMeta",
    "TracedCheckError",
    "TracedComparisonError",
    "UnassignedFieldError",
    "ValidationError",
    "build",
    "check_types",
    "class_options",
    "class_ref",
    "constraints",
    "dataclass",
    "derived_fields",
    "explain_recompiles",
    "field",
    "fields",
    "get_printoptions",
    "has_custom_init",
    "is_registered_pytree_type",
    "is_struct",
    "lookup_class",
    "node_fields",
    "opaque_fields",
    "optree_namespace",
    "pformat",
    "printoptions",
    "refusal_of",
    "register_attrs_type",
    "register_class",
    "register_pytree_type",
    "resolve_class",
    "resolve_pytree_spec",
    "select",
    "set_optree_namespace",
    "set_printoptions",
    "static_fields",
    "tree_at",
    "tree_equal",
]
