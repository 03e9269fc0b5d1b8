"""A contributor can follow export and load (issue 46): few modules, no call back down,
and docs/contributing.md walks them as the code does.

The tracer records, in the calling thread, every call that enters a module of
``jaxstruct.io`` (the module that defines the function called): which modules a
call passes, and each call into a module already on the call stack below the
caller's (publish -> detect -> publish). The calls are traced warm, after a first
export and load have loaded the plugins and started the pools.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "contributing.md"
PACKAGE = "jaxstruct.io"
#: The most modules of jaxstruct.io one of the traced calls may pass.
MOST_MODULES = 9


class Small(js.Struct):
    """A small struct of the kind a training loop saves."""

    w: Any
    b: Any
    opt: dict[str, Any]
    step: int = js.field(static=True, default=0)


def _small() -> Small:
    return Small(
        w=jnp.ones((2, 3), jnp.float32),
        b=np.zeros(3, np.float32),
        opt={"mu": jnp.zeros(3), "count": 7},
        step=3,
    )


def _module(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    name = frame.f_globals.get("__name__", "")
    return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None


@dataclass
class Walk:
    """What one traced call did: the modules it passed (in the order first entered), the
    calls back down, and every function of jaxstruct.io entered (module, qualified name)."""

    modules: list[str] = field(default_factory=list)
    back_down: list[str] = field(default_factory=list)
    entered: list[tuple[str, str]] = field(default_factory=list)


def trace(call: Callable[[], Any]) -> Walk:
    """Run ``call`` under a profiler recording the calls into jaxstruct.io's modules."""
    walk = Walk()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = _module(frame)
        if callee is None:
            return
        walk.entered.append((callee, frame.f_code.co_qualname))
        below: list[str] = []  # the io modules on the stack, innermost first, runs merged
        up = frame.f_back
        while up is not None:
            module = _module(up)
            if module is not None and (not below or below[-1] != module):
                below.append(module)
            up = up.f_back
        if callee not in walk.modules:
            walk.modules.append(callee)
        if below and below[0] != callee and callee in below[1:]:
            walk.back_down.append(f"{' -> '.join(reversed(below))} -> {callee}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return walk


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The formats, plugins and pools warm: a first export and load of each kind done."""
    root = tmp_path_factory.mktemp("walk")
    jio.load(jio.export(_small(), root / "first"))
    jio.load(jio.export(_small(), root / "first.zip"))


def _prepared(name: str, where: Path) -> Callable[[], Any]:
    """The call ``name``, with what it needs on disk already there."""
    if name == "export to a directory":
        return lambda: jio.export(_small(), where / "ck")
    if name == "export to a .zip":
        return lambda: jio.export(_small(), where / "ck.zip")
    path = jio.export(_small(), where / "ck")
    if name == "export with overwrite=True":
        return lambda: jio.export(_small(), path, overwrite=True)
    return lambda: jio.load(path)


CALLS = ["export to a directory", "export to a .zip", "export with overwrite=True", "load"]


@pytest.mark.usefixtures("warm")
@pytest.mark.parametrize("name", CALLS)
def test_a_traced_call_passes_few_modules(tmp_path: Path, name: str) -> None:
    """Each of export (directory, .zip, overwrite) and load passes at most nine modules."""
    walk = trace(_prepared(name, tmp_path))
    assert len(walk.modules) <= MOST_MODULES, walk.modules


@pytest.mark.usefixtures("warm")
@pytest.mark.parametrize("name", CALLS)
def test_a_traced_call_never_calls_back_down(tmp_path: Path, name: str) -> None:
    """No call of export or load enters a module already below it on the call stack."""
    walk = trace(_prepared(name, tmp_path))
    assert walk.back_down == []


def test_the_tracer_sees_a_call_back_down() -> None:
    """The tracer counts modules, and reports a call from a module into one that calls
    back into the first (module a -> module b -> module a)."""
    first: dict[str, Any] = {"__name__": f"{PACKAGE}._first"}
    second: dict[str, Any] = {"__name__": f"{PACKAGE}._second"}
    exec("def enter():\n    return down()\n\ndef again():\n    return 1\n", first)
    exec("def down():\n    return again()\n", second)
    first["down"], second["again"] = second["down"], first["again"]
    walk = trace(first["enter"])
    assert walk.modules == [f"{PACKAGE}._first", f"{PACKAGE}._second"]
    assert walk.back_down == [f"{PACKAGE}._first -> {PACKAGE}._second -> {PACKAGE}._first"]


# -- the page's walk is the code's ------------------------------------------------------

_STEP = re.compile(r"^\d+\. \*\*(?P<title>[^*]+)\*\* \(`(?P<name>_\w+\.[\w.]+)`")


def _steps(heading: str) -> list[str]:
    """The step functions the page lists under ``heading`` (``_module.qualname``)."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = [m.group("name") for m in map(_STEP.match, section.splitlines()) if m]
    assert found, f"no steps under {heading!r}"
    return found


def _first_calls(walk: Walk, names: list[str]) -> list[int]:
    """Where each of ``names`` was first entered (a class: its ``__init__``)."""
    positions = []
    for name in names:
        module, _, qualname = name.partition(".")
        at = next(
            (
                i
                for i, (mod, qual) in enumerate(walk.entered)
                if mod == f"{PACKAGE}.{module}" and qual in (qualname, f"{qualname}.__init__")
            ),
            None,
        )
        assert at is not None, f"{name} is not called"
        positions.append(at)
    return positions


def test_the_export_walk_of_the_page_is_the_code_s(tmp_path: Path) -> None:
    """docs/contributing.md's export steps are functions export calls, in that order
    (a plugin's format, so that its output is checked)."""
    names = _steps("What happens on export")
    jio.export({"w": np.ones(3)}, tmp_path / "warm.tar")
    walk = trace(lambda: jio.export({"w": np.ones(3)}, tmp_path / "ck.tar"))
    positions = _first_calls(walk, names)
    assert positions == sorted(positions), dict(zip(names, positions, strict=True))


def test_the_load_walk_of_the_page_is_the_code_s(tmp_path: Path) -> None:
    """docs/contributing.md's load steps are functions load calls, in that order."""
    names = _steps("What happens on load")
    path = jio.export({"w": np.ones(3)}, tmp_path / "ck.tar")
    jio.load(path)
    walk = trace(lambda: jio.load(path))
    positions = _first_calls(walk, names)
    assert positions == sorted(positions), dict(zip(names, positions, strict=True))
