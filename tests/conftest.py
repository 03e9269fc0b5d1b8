"""Suite-wide settings: strict dtype promotion and Hypothesis profiles."""

from __future__ import annotations

import os

import jax
from hypothesis import HealthCheck, settings

# Implicit dtype promotion hides bugs in array handling; the suite runs strict.
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Eight CPU devices, so sharded arrays and restore targets are tested in-process.
try:
    jax.config.update("jax_num_cpu_devices", 8)
except AttributeError:  # JAX before 0.5 (the lowest-versions run): the XLA flag instead
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]
    ).strip()

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
