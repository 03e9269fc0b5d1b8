"""MkDocs hooks of the docs build (registered in ``mkdocs.yml`` under ``hooks:``).

* The API reference (``docs/api/<layer>.md``) is the one place where objects are
  rendered with ``::: identifier``. A guide page may still end with an "API"
  list of ``::: identifier`` lines: there each line becomes a link to the
  object's entry in the reference, so no object is rendered twice (two
  headings for one object would make every cross-reference ambiguous).
* A layer listed in ``LAYERS`` without a ``docs/api/<layer>.md`` of its own gets
  a generated page: its package rendered whole when it is installed, otherwise
  a note saying which distribution provides it.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

from mkdocs.structure.files import File

DIRECTIVE = re.compile(r"^::: *([\w.]+)[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n(?=[ \t]+\S))*)", re.M)
LAYERS = ("registry", "core", "io", "abc", "testing", "orbax", "safetensors")


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Turn ``::: name`` lines of guide pages into links to the API reference."""
    if page.file.src_uri.startswith("api/"):
        return markdown
    return DIRECTIVE.sub(lambda m: f"- [`{m.group(1)}`][{m.group(1)}]\n", markdown)


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    """Add a generated API page for each layer that has no hand-written one."""
    for layer in LAYERS:
        uri = f"api/{layer}.md"
        if files.get_file_from_path(uri) is not None:
            continue
        package = f"jaxstruct.{layer}"
        if _installed(package):
            content = f"# `{package}`\n\n::: {package}\n"
        else:
            content = (
                f"# `{package}`\n\n`{package}` is not installed where this site was built. "
                f"It is provided by the `jaxstruct-{layer}` distribution: "
                f"`pip install jaxstruct-{layer}`.\n"
            )
        files.append(File.generated(config, uri, content=content))
    return files


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:
        return False
