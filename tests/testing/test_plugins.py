"""The entry points: Hypothesis's from_type hook and the pytest fixtures."""

import importlib.metadata
import subprocess
import sys
import textwrap

import jaxstruct.core as js
import numpy as np
from hypothesis import find
from hypothesis import strategies as st
from hypothesis.strategies._internal import types as hypothesis_types
from jaxstruct.testing import _hypothesis_hook


def _entry_points(group):
    dist = importlib.metadata.distribution("jaxstruct-testing")
    return {ep.name: ep.value for ep in dist.entry_points if ep.group == group}


def test_hypothesis_entry_point_declared():
    """jaxstruct-testing declares the hypothesis entry point pointing at setup_hypothesis."""
    assert _entry_points("hypothesis") == {
        "jaxstruct": "jaxstruct.testing._hypothesis_hook:setup_hypothesis"
    }


def test_pytest11_entry_point_declared():
    """jaxstruct-testing declares its pytest plugin."""
    assert _entry_points("pytest11") == {"jaxstruct": "jaxstruct.testing._plugin"}


def test_new_struct_classes_are_registered():
    """A struct class defined after setup resolves with st.from_type()."""

    class Fresh(js.Struct):
        w: np.ndarray

    assert Fresh in hypothesis_types._global_type_lookup
    assert isinstance(find(st.from_type(Fresh), lambda _: True), Fresh)


def test_generated_classes_are_not_registered():
    """Classes made by struct_classes() stay out of Hypothesis's global table."""
    from jaxstruct.testing import struct_classes

    cls = find(struct_classes(), lambda _: True)
    assert cls not in hypothesis_types._global_type_lookup


def test_setup_waits_for_core_import(monkeypatch):
    """Without jaxstruct.core imported, setup installs a finder instead of importing JAX."""
    monkeypatch.delitem(sys.modules, "jaxstruct.core")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    _hypothesis_hook.setup_hypothesis()
    finders = [f for f in sys.meta_path if isinstance(f, _hypothesis_hook._AfterCoreImport)]
    assert len(finders) == 1
    assert "jaxstruct.core" not in sys.modules


def test_setup_is_idempotent(monkeypatch):
    """Running the hook twice registers its class hook once."""
    from jaxstruct.core._meta import class_created_hooks

    monkeypatch.setattr("jaxstruct.core._meta.class_created_hooks", class_created_hooks)
    _hypothesis_hook.setup_hypothesis()
    _hypothesis_hook.setup_hypothesis()
    assert class_created_hooks.count(_hypothesis_hook.register_struct) == 1


def test_roundtrip_fixture_cleans_up_passing_checks(assert_roundtrip, tmp_path_factory):
    """The assert_roundtrip fixture checks in a fresh directory, removed when the check passes."""

    class Fixtured(js.Struct):
        w: np.ndarray

    assert_roundtrip(Fixtured(w=np.ones(2)))
    assert not list(tmp_path_factory.getbasetemp().glob("roundtrip*/*"))


def test_fixtures_work_under_given(tmp_path):
    """Both fixtures pass Hypothesis' function_scoped_fixture health check inside @given."""
    test_file = tmp_path / "test_fixtures_given.py"
    test_file.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import jaxstruct.core as js
            from hypothesis import given, settings
            from jaxstruct.testing import structs

            class State(js.Struct):
                w: np.ndarray

            @settings(max_examples=3, database=None, deadline=None)
            @given(structs(State))
            def test_state(assert_roundtrip, assert_pytree_roundtrip, state):
                assert_roundtrip(state, formats=["state_dict", "zip"])
                assert_pytree_roundtrip(state)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_pytree_roundtrip_fixture(assert_pytree_roundtrip):
    """The assert_pytree_roundtrip fixture is the library function."""
    from jaxstruct.testing import assert_pytree_roundtrip as function

    assert assert_pytree_roundtrip is function
