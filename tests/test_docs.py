"""The documentation's examples and the package docstrings' examples run."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
LAYERS = ("registry", "core", "io", "orbax", "abc", "testing")


def _modules() -> list[str]:
    names = []
    for layer in LAYERS:
        try:
            package = importlib.import_module(f"jaxstruct.{layer}")
        except ImportError:  # pragma: no cover - every layer is installed in the workspace
            continue
        names.append(package.__name__)
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            names.append(info.name)
    return names


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_doc_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block of a docs page runs, in order, in one fresh namespace."""
    blocks = BLOCK.findall(page.read_text(encoding="utf-8"))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for index, source in enumerate(blocks):
        code = compile(source, f"{page.name}[block {index}]", "exec", dont_inherit=True)
        exec(code, namespace)


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples_run(module_name: str) -> None:
    """Every docstring example of every module passes as a doctest."""
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for index, test in enumerate(finder.find(module, module_name)):
        # Run each example in a real (throwaway) module, as user code runs, so
        # classes it defines resolve their annotations in its namespace.
        scratch = types.ModuleType(f"_doctest_{module_name.replace('.', '_')}_{index}")
        # Only the module's own names: copying __spec__/__path__ would make the
        # scratch module pose as the package and get its submodules imported twice.
        scratch.__dict__.update(
            (k, v) for k, v in test.globs.items() if not (k.startswith("__") and k.endswith("__"))
        )
        sys.modules[scratch.__name__] = scratch
        test.globs = scratch.__dict__
        try:
            runner.run(test, clear_globs=False)
        finally:
            del sys.modules[scratch.__name__]
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {module_name}"
