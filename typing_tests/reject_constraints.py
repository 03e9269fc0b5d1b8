"""Constraints are checked like other calls: bounds are numbers, keywords are keywords."""

from jaxstruct.core.constraints import bounded, positive_definite

bounded("0", 1)  # expected-error
bounded(0, 1, True)  # expected-error
positive_definite.explain()  # expected-error
