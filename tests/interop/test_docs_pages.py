"""The ```python blocks of the interoperability docs pages run as written, each on its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("optree.md", "jaxtyping.md", "selectors.md")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks() -> list[tuple[str, int, str]]:
    out = []
    for page in PAGES:
        text = (DOCS / page).read_text(encoding="utf-8")
        for i, match in enumerate(BLOCK.finditer(text)):
            out.append((page, i, match.group(1)))
    return out


@pytest.mark.parametrize(("page", "index", "code"), _blocks(), ids=lambda v: str(v)[:20])
def test_docs_block_runs(page: str, index: int, code: str) -> None:
    """Each example block runs standalone without raising."""
    namespace = {"__name__": f"docs_{page.split('.', maxsplit=1)[0]}_{index}"}
    exec(compile(code, f"{page}[{index}]", "exec", dont_inherit=True), namespace)
