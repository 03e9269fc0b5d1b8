"""The documentation's examples and the package docstrings' examples run.

Every ```python block of a docs page runs as a reader would copy it: on its own,
in a fresh namespace and an empty working directory. A block that builds on the
one before it (a tutorial's next step) says so in its first line,
``# Continues the example above.``, and runs after the blocks it continues; such
a block must fail on its own (else the line is wrong). Blocks indented inside
content tabs run too. Code that is shown but not run (another library's side of
a comparison, configuration files, shell commands) uses another fence language:
``py`` for Python that is not run, ``toml``, ``sh``, ...; a fence language
outside that list fails the suite, so a typo cannot silently skip a block.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import io
import pkgutil
import re
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "CHANGELOG.md"]
BLOCK = re.compile(r"^([ \t]*)```python\n(.*?)^\1```[ \t]*$", re.S | re.M)
FENCE = re.compile(r"^[ \t]*```([^\s`{]*)")
# Fence languages that are shown but never run.
SHOWN = frozenset({"py", "pycon", "toml", "ini", "sh", "bash", "console", "text", "json", "yaml"})
LAYERS = ("registry", "core", "io", "orbax", "safetensors", "abc", "testing")
#: The first line of a block that runs after the blocks before it (it is not on its own).
CONTINUES = "# Continues the example above."


def _modules() -> list[str]:
    names = []
    for layer in LAYERS:
        try:
            package = importlib.import_module(f"jaxstruct.{layer}")
        except ImportError:  # pragma: no cover - every layer is installed in the workspace
            continue
        names.append(package.__name__)
        # walk_packages: private subpackages (core._select) hold docstrings too.
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            names.append(info.name)
    return names


def _page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _python_blocks(text: str) -> list[str]:
    return [textwrap.dedent(source) for _, source in BLOCK.findall(text)]


def _fence_languages(text: str) -> list[str]:
    """The language of every opening fence of a Markdown text, in order."""
    languages, inside = [], False
    for line in text.splitlines():
        match = FENCE.match(line)
        if match is None:
            continue
        if not inside:
            languages.append(match.group(1))
        inside = not inside
    return languages


def _chains(blocks: list[str]) -> list[list[tuple[int, str]]]:
    """The blocks grouped as they run: a block starts a chain of its own unless it
    continues the example above."""
    chains: list[list[tuple[int, str]]] = []
    for index, source in enumerate(blocks):
        if source.startswith(CONTINUES) and chains:
            chains[-1].append((index, source))
        else:
            chains.append([(index, source)])
    return chains


def _run(page: Path, chain: list[tuple[int, str]]) -> None:
    namespace: dict[str, object] = {"__name__": "docs_" + re.sub(r"\W", "_", page.stem)}
    for index, source in chain:
        code = compile(source, f"{page.name}[block {index}]", "exec", dont_inherit=True)
        exec(code, namespace)


@pytest.mark.parametrize("page", DOC_PAGES, ids=_page_id)
def test_doc_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block of a docs page runs as copied: on its own, in a fresh
    namespace and directory, or after the blocks it says it continues."""
    blocks = _python_blocks(page.read_text(encoding="utf-8"))
    assert not (blocks and blocks[0].startswith(CONTINUES)), "the first block continues nothing"
    for number, chain in enumerate(_chains(blocks)):
        where = tmp_path / f"example-{number}"
        where.mkdir()
        monkeypatch.chdir(where)
        _run(page, chain)


@pytest.mark.parametrize("page", DOC_PAGES, ids=_page_id)
def test_doc_page_blocks_that_continue_need_the_blocks_above(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block marked as continuing the example above fails on its own: the mark is only
    where a reader must copy the blocks before it too."""
    blocks = _python_blocks(page.read_text(encoding="utf-8"))
    standalone = []
    for index, source in enumerate(blocks):
        if not source.startswith(CONTINUES):
            continue
        where = tmp_path / f"alone-{index}"
        where.mkdir()
        monkeypatch.chdir(where)
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                _run(page, [(index, source)])
        except Exception:
            continue
        standalone.append(index)
    assert not standalone, (
        f"{page.name}: blocks {standalone} run on their own; drop their {CONTINUES!r} line"
    )


def test_a_block_continuing_the_one_above_runs_after_it() -> None:
    """Blocks group into chains at the continuation line; others stand alone."""
    blocks = ["a = 1\n", f"{CONTINUES}\nb = a\n", "c = 3\n", f"{CONTINUES}\nd = c\n"]
    assert [[i for i, _ in chain] for chain in _chains(blocks)] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("page", DOC_PAGES, ids=_page_id)
def test_doc_page_code_blocks_are_run_or_marked_shown(page: Path) -> None:
    """Every code block of a docs page is ```python (run) or a language that is only shown."""
    languages = _fence_languages(page.read_text(encoding="utf-8"))
    unknown = [lang for lang in languages if lang != "python" and lang not in SHOWN]
    assert not unknown, f"{page.name}: fences {unknown} are neither run nor in {sorted(SHOWN)}"
    assert len(_python_blocks(page.read_text(encoding="utf-8"))) == languages.count("python")


def test_python_blocks_inside_content_tabs_are_found() -> None:
    """A ```python block indented inside a tab is collected and dedented, a ```py one is not."""
    text = '=== "a"\n\n    ```python\n    x = 1\n    ```\n\n=== "b"\n\n    ```py\n    y\n    ```\n'
    assert _python_blocks(text) == ["x = 1\n"]
    assert _fence_languages(text) == ["python", "py"]


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
