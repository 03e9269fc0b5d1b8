"""Error types of ``jaxstruct.core`` (the shared ones come from the registry layer)."""

from __future__ import annotations

import dataclasses

from jaxstruct.registry import StructError

__all__ = [
    "FrozenStructError",
    "MissingDistributionError",
    "StructDefinitionError",
    "TracedComparisonError",
    "UnassignedFieldError",
    "ValidationError",
]


class ValidationError(StructError, ValueError):
    """A field value was rejected by a validator, a static-field check or a type check."""


class UnassignedFieldError(ValidationError, TypeError):
    """A required field was never assigned (by a custom ``__init__`` or ``__post_init__``).

    A ``TypeError``, as a missing constructor argument is, and a
    :class:`ValidationError`, so code catching either sees it.
    """


class FrozenStructError(StructError, dataclasses.FrozenInstanceError, AttributeError):
    """An attribute of a constructed (frozen) struct was set or deleted.

    Also a :class:`dataclasses.FrozenInstanceError` (what ``except`` clauses of
    code written for frozen dataclasses, flax.struct or chex catch), and so an
    ``AttributeError``.
    """


class StructDefinitionError(StructError, TypeError):
    """A struct class is declared in a way that would silently misbehave."""


class MissingDistributionError(StructError, ImportError):
    """A feature needs a jaxstruct distribution that is not installed."""


class TracedComparisonError(StructError, TypeError):
    """``==`` was asked about structs whose arrays are traced (values unknown until run)."""
