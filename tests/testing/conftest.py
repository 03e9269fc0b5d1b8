"""Hypothesis profiles for this directory: 'ci' keeps the suite fast on two cores."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=15,
    deadline=None,  # the first jit of each new struct class compiles; timing is meaningless
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("JAXSTRUCT_HYPOTHESIS_PROFILE", "ci"))
