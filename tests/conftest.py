"""Suite-wide settings: strict dtype promotion, Hypothesis profiles, the run without orbax."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import jax
import pytest
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
# The runs of scripts/test.sh after its first (other interpreters, the floors).
settings.register_profile(
    "repeat",
    max_examples=15,
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

# scripts/test.sh runs the suite once at the floors without jaxstruct-orbax (its JAX
# floor is above the other layers'), and says so with JAXSTRUCT_TEST_WITHOUT_ORBAX=1:
# only then are the tests that need it skipped. Every other run needs jaxstruct-orbax.
WITHOUT_ORBAX = os.environ.get("JAXSTRUCT_TEST_WITHOUT_ORBAX") == "1"
# tests/orbax imports jaxstruct.orbax at collection.
collect_ignore = ["orbax"] if WITHOUT_ORBAX else []
# ... and once at the floors with it, on the oldest Python, where only the tests that
# need jaxstruct-orbax are run (JAXSTRUCT_TEST_ONLY_ORBAX=1; the others are deselected:
# the run without it tests them at the other layers' lower floors).
ONLY_ORBAX = os.environ.get("JAXSTRUCT_TEST_ONLY_ORBAX") == "1"


# The peers: other libraries whose pytrees jaxstruct stores and whose behaviour the
# docs describe (the `peers` dependency group). Their tests skip where they are not
# installed (the lowest-versions runs);
# scripts/test.sh says JAXSTRUCT_TEST_PEERS=1 for the runs at uv.lock's versions,
# where a missing peer is an error instead of a silent skip.
PEERS = ("flax", "equinox", "optax", "chex")
REQUIRE_PEERS = os.environ.get("JAXSTRUCT_TEST_PEERS") == "1"


def pytest_configure(config: pytest.Config) -> None:
    missing = [name for name in PEERS if importlib.util.find_spec(name) is None]
    if REQUIRE_PEERS and missing:
        raise pytest.UsageError(
            f"JAXSTRUCT_TEST_PEERS=1 runs the tests against {', '.join(PEERS)}, but "
            f"{', '.join(missing)} is not installed: sync with `uv sync --frozen --all-packages` "
            "(the peers group is a default one), or unset JAXSTRUCT_TEST_PEERS to skip them"
        )
    if WITHOUT_ORBAX and importlib.util.find_spec("jaxstruct.orbax") is not None:
        raise pytest.UsageError(
            "JAXSTRUCT_TEST_WITHOUT_ORBAX=1 skips the orbax tests, but jaxstruct.orbax is "
            "installed: unset JAXSTRUCT_TEST_WITHOUT_ORBAX to run them"
        )
    if ONLY_ORBAX and WITHOUT_ORBAX:
        raise pytest.UsageError(
            "JAXSTRUCT_TEST_ONLY_ORBAX=1 and JAXSTRUCT_TEST_WITHOUT_ORBAX=1 select nothing: "
            "unset one of them"
        )


def _needs_orbax(item: pytest.Item) -> str | None:
    """Why ``item`` cannot run without jaxstruct-orbax, or ``None`` when it can."""
    if item.path.name == "test_packaging.py":  # reads the packages' files, imports none
        return None
    if "orbax" in item.name:  # the orbax format or module as a parameter, or in the name
        return "it tests jaxstruct-orbax"
    params = getattr(item, "callspec", None)
    page = params.params.get("page") if params is not None else None
    runs_page = getattr(item, "originalname", "") == "test_doc_page_examples_run"
    if runs_page and isinstance(page, Path) and 'format="orbax"' in page.read_text("utf-8"):
        return f"{page.name} saves with the orbax format"
    return None


_PEER_IMPORT = re.compile(r"^\s*(?:import|from) (flax|equinox|optax|chex)\b", re.M)


def _needs_missing_peer(item: pytest.Item) -> str | None:
    """Why a docs page ``item`` runs cannot run here (it imports a missing peer), or ``None``."""
    params = getattr(item, "callspec", None)
    page = params.params.get("page") if params is not None else None
    if getattr(item, "originalname", "") != "test_doc_page_examples_run":
        return None
    if not isinstance(page, Path):
        return None
    for name in _PEER_IMPORT.findall(page.read_text("utf-8")):
        if importlib.util.find_spec(name) is None:
            return f"{page.name} has an import of {name}, which is not installed in this run"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not REQUIRE_PEERS:
        # The test modules of the peers skip themselves (pytest.importorskip).
        for item in items:
            reason = _needs_missing_peer(item)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
    if ONLY_ORBAX:
        orbax_tests = Path(__file__).resolve().parent / "orbax"
        kept = [i for i in items if orbax_tests in i.path.parents or _needs_orbax(i)]
        dropped = [i for i in items if not (orbax_tests in i.path.parents or _needs_orbax(i))]
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        return
    if not WITHOUT_ORBAX:
        return
    for item in items:
        reason = _needs_orbax(item)
        if reason is not None:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"jaxstruct-orbax is not installed in this run "
                    f"(JAXSTRUCT_TEST_WITHOUT_ORBAX=1), and {reason}"
                )
            )
