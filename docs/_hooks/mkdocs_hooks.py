"""MkDocs hooks of the docs build (registered in ``mkdocs.yml`` under ``hooks:``).

The API reference (``docs/api/*.md``) is the one place where objects are
rendered with ``::: identifier``. A guide page may still end with an "API"
list of ``::: identifier`` lines: there each line becomes a link to the
object's entry in the reference, so no object is rendered twice (two
headings for one object would make every cross-reference ambiguous).
"""

from __future__ import annotations

import re
from typing import Any

DIRECTIVE = re.compile(r"^::: *([\w.]+)[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n(?=[ \t]+\S))*)", re.M)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Turn ``::: name`` lines of guide pages into links to the API reference."""
    if page.file.src_uri.startswith("api/"):
        return markdown
    return DIRECTIVE.sub(lambda m: f"- [`{m.group(1)}`][{m.group(1)}]\n", markdown)
