"""The examples in docs/io.md run, and the public docstring examples pass as doctests."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "io.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_docs_example_runs(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Each ```python block of docs/io.md runs standalone."""
    exec(compile(BLOCKS[index], f"{DOC}:block{index}", "exec"), {"__name__": f"docs_io_{index}"})


MODULES = [
    "jaxstruct.io._state",
    "jaxstruct.io._checkpoint",
    "jaxstruct.io._inspect",
    "jaxstruct.io._codecs",
    "jaxstruct.io._formats",
    "jaxstruct.io._plugins",
    "jaxstruct.io._cli",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    """Docstring examples of public callables pass as doctests."""
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
