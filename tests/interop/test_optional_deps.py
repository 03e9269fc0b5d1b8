"""optree, jaxtyping and beartype stay optional: never imported by us, never needed."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _ok(code: str) -> str:
    result = _run(code)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_does_not_import_optional_packages() -> None:
    """Importing jaxstruct.core (and defining a class) imports neither optree nor jaxtyping."""
    out = _ok(
        """
        import sys
        import jaxstruct.core as js
        class P(js.Struct):
            x: int
        P(x=1)
        print(sorted(m for m in ("optree", "jaxtyping", "beartype") if m in sys.modules))
        """
    )
    assert out.strip() == "[]"


def test_everything_works_without_optree() -> None:
    """With optree blocked, structs, selectors and the namespace setting still work."""
    _ok(
        """
        import sys
        sys.modules["optree"] = None
        import jax
        import jaxstruct.core as js
        class P(js.Struct, optree_namespace="ns"):
            x: object
            tag: str = js.field(static=True, default="t")
        p = P(x=1.0)
        assert jax.tree.map(lambda v: v + 1, p) == P(x=2.0)
        assert js.select(p).at(lambda t: t.x).set(3.0) == P(x=3.0)
        js.set_optree_namespace("other")
        try:
            import optree
        except ImportError:
            pass
        else:
            raise AssertionError("optree should be blocked")
        """
    )


def test_typecheck_without_jaxtyping_says_what_to_install() -> None:
    """With jaxtyping blocked, typecheck=True raises MissingDistributionError naming the extra."""
    out = _ok(
        """
        import sys
        sys.modules["jaxtyping"] = None
        import jaxstruct.core as js
        class Plain(js.Struct):
            x: int
        Plain(x=1)
        try:
            class S(js.Struct, typecheck=True):
                x: int
        except js.MissingDistributionError as err:
            print(err)
        """
    )
    assert "jaxstruct-core[jaxtyping]" in out


def test_optree_imported_later_registers_existing_classes() -> None:
    """Classes defined before optree is imported become optree pytrees on its import."""
    _ok(
        """
        import sys
        import jaxstruct.core as js
        class P(js.Struct):
            x: object
            y: object
        class Q(js.Struct, optree_namespace="late"):
            z: object
        class Foreign:
            def __init__(self, a):
                self.a = a
        js.register_pytree_type(
            Foreign, flatten=lambda f: ((f.a,), None), unflatten=lambda _, ch: Foreign(*ch)
        )
        assert "optree" not in sys.modules
        import optree
        assert optree.tree_leaves(P(x=1, y=2)) == [1, 2]
        assert optree.tree_leaves(Q(z=3), namespace="late") == [3]
        assert optree.tree_leaves(Foreign(4)) == [4]
        class R(js.Struct):
            w: object
        assert optree.tree_leaves(R(w=5)) == [5]
        """
    )


def test_optree_imported_first() -> None:
    """When optree is imported before jaxstruct.core, classes are registered at definition."""
    _ok(
        """
        import optree
        import jaxstruct.core as js
        class P(js.Struct):
            x: object
        assert optree.tree_map(lambda v: v * 2, P(x=2)) == P(x=4)
        """
    )


def test_class_definition_without_optree_leaves_optree_alone() -> None:
    """Without optree imported, defining classes neither imports optree nor registers anything
    with it: the listener stops at its ``sys.modules`` lookup. (What defining a class costs is
    measured by the class-definition rows of benchmarks/bench_core.py, not here.)"""
    _ok(
        """
        import sys
        import jaxstruct.core as js
        from jaxstruct.core import _optree
        for _ in range(20):
            class S(js.Struct):
                a: object
                step: int = js.field(static=True, default=0)
        assert "optree" not in sys.modules
        assert _optree._registered == {}
        assert S in _optree._specs  # remembered for optree's import, nothing more
        """
    )
