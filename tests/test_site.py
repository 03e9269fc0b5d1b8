"""The built docs site: complete API reference, rendered docstrings, and a real browser's view.

The site is built once per test process with ``mkdocs build --strict``. The
browser tests drive the system's Chromium through its chromedriver (Debian:
``apt-get install chromium chromium-driver``) over HTTP on 127.0.0.1; where
Chromium is missing they are skipped, except under CI (``CI=true``), where a
missing browser is a failure.
"""

from __future__ import annotations

import functools
import html
import http.server
import importlib
import os
import re
import shutil
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("registry", "core", "io", "abc", "testing", "orbax")
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built from the working tree."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _layers() -> list[types.ModuleType]:
    found = []
    for layer in LAYERS:
        try:
            found.append(importlib.import_module(f"jaxstruct.{layer}"))
        except ImportError:  # pragma: no cover - a layer not installed in this environment
            continue
    return found


def _home(package: types.ModuleType, name: str) -> str:
    """The layer whose API page documents ``name`` (re-exports live with their definition)."""
    obj = getattr(package, name)
    module = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", "")
    for layer in LAYERS:
        if module == f"jaxstruct.{layer}" or str(module).startswith(f"jaxstruct.{layer}."):
            return layer
    return package.__name__.rpartition(".")[2]


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("index.html") if p.parent != site / "search")


# -- the API reference ----------------------------------------------------------------
def test_every_layer_has_an_api_page(site: Path) -> None:
    """Each installed layer has a reference page rendering its package."""
    for package in _layers():
        layer = package.__name__.rpartition(".")[2]
        page = site / "api" / layer / "index.html"
        assert page.is_file(), f"no API page for {package.__name__}: add docs/api/{layer}.md"
        assert package.__name__ in _ids(page)


def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    """Every name in a layer's __all__ has an anchor on the API page of the layer defining it."""
    missing = []
    for package in _layers():
        for name in package.__all__:
            layer = _home(package, name)
            page = site / "api" / layer / "index.html"
            anchor = f"jaxstruct.{layer}.{name}"
            if not page.is_file() or anchor not in _ids(page):
                missing.append(f"{package.__name__}.{name} (expected #{anchor})")
    assert not missing, missing


def test_every_public_name_is_described(site: Path) -> None:
    """Every public name has a docstring, or (a constant) a sentence on its layer's API page."""
    undescribed = []
    for package in _layers():
        layer = package.__name__.rpartition(".")[2]
        written = ROOT / "docs" / "api" / f"{layer}.md"  # absent: a generated page
        page_source = written.read_text(encoding="utf-8") if written.is_file() else ""
        for name in package.__all__:
            obj = getattr(package, name)
            own_doc = (
                not isinstance(obj, str | int | float | tuple)
                and (getattr(obj, "__doc__", None) or "").strip()
            )
            if not own_doc and f"`{name}`" not in page_source:
                undescribed.append(f"{package.__name__}.{name}")
    assert not undescribed, undescribed


def test_no_sphinx_role_is_left_in_any_page(site: Path) -> None:
    """No page shows a literal ``:func:`` / ``:class:`` / ... role."""
    role = re.compile(r":(?:func|class|meth|attr|data|exc|mod|obj):(?:<code>|`)")
    offenders = [str(p.relative_to(site)) for p in _pages(site) if role.search(p.read_text())]
    assert not offenders, offenders


def test_sphinx_roles_become_links_to_the_reference(site: Path) -> None:
    """A role in a docstring (Selection's ``:func:`select```) is a link to that entry."""
    page = (site / "api" / "core" / "index.html").read_text(encoding="utf-8")
    start = page.index('id="jaxstruct.core.Selection"')
    body = page[start : start + 6000]
    assert re.search(r'<a [^>]*href="#jaxstruct\.core\.select"[^>]*><code>select</code></a>', body)


def test_docstring_examples_render_as_code_blocks(site: Path) -> None:
    """``>>>`` examples are highlighted code blocks, never text running into a paragraph."""
    for layer in ("core", "io", "abc", "testing", "registry"):
        page = (site / "api" / layer / "index.html").read_text(encoding="utf-8")
        paragraphs = re.findall(r"<p>(.*?)</p>", page, re.S)
        assert not [p for p in paragraphs if "&gt;&gt;&gt;" in p], layer
        if layer != "registry":
            assert '<span class="gp">&gt;&gt;&gt; </span>' in page, layer


def test_typing_only_redeclarations_do_not_hide_runtime_methods(site: Path) -> None:
    """``Struct.replace`` is documented as the method with its docstring, not as a property."""
    page = (site / "api" / "core" / "index.html").read_text(encoding="utf-8")
    start = page.index('id="jaxstruct.core.Struct.replace"')
    entry = html.unescape(re.sub(r"<[^>]+>", "", page[start : start + 3000]))
    assert "Return a copy with some fields changed" in entry
    assert "property" not in entry.split("Return a copy")[0]


# -- in a browser -------------------------------------------------------------------
def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser and driver:
        return browser, driver
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site over HTTP on 127.0.0.1 (search needs HTTP: its worker fetches the index)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=TIMEOUT)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium from the system's packages, with a fresh profile; never downloads one."""
    found = _chromium()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium and chromedriver are required in CI (.ci/run installs them)")
        pytest.skip("no chromium/chromedriver on PATH (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, condition: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, TIMEOUT).until(condition)


def test_every_page_renders_in_a_browser(site: Path, served: str, browser: Any) -> None:
    """Every page of the site loads in Chromium with a heading and content, without JS errors."""
    from selenium.webdriver.common.by import By

    for page in _pages(site):
        path = page.parent.relative_to(site).as_posix()
        url = served + (f"{path}/" if path != "." else "")
        browser.get(url)
        heading = _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "article h1"))
        assert heading.text.strip(), url
        article = browser.find_element(By.CSS_SELECTOR, "article")
        assert len(article.text) > 80, url
        errors = [
            entry
            for entry in browser.get_log("browser")
            if entry.get("level") == "SEVERE" and "favicon" not in entry.get("message", "")
        ]
        assert not errors, (url, errors)


def test_navigation_links_lead_to_their_pages(served: str, browser: Any) -> None:
    """Following the navigation from the home page reaches the Quickstart and an API page."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for title, path in (("Quickstart", "quickstart/"), ("jaxstruct.core", "api/core/")):
        browser.get(served)

        def find_link(driver: Any, title: str = title) -> Any:
            links = driver.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary a.md-nav__link")
            try:
                found = [
                    a for a in links if (a.get_attribute("textContent") or "").strip() == title
                ]
            except StaleElementReferenceException:  # the page changed under us: look again
                return False
            return found[0] if found else False

        # Waited for, not looked up once: a page still settling showed no such link once.
        link = _wait(browser, find_link)
        assert link.get_attribute("href") == served + path
        browser.get(link.get_attribute("href"))
        _wait(browser, lambda d, p=path: d.current_url == served + p)
        assert browser.find_element(By.CSS_SELECTOR, "article h1").text.strip()


def test_search_finds_the_api_entry(served: str, browser: Any) -> None:
    """Typing in the search box lists results, among them the API reference of replace."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By

    browser.get(served)
    box = _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "input.md-search__input"))
    box.click()  # as a user does; the box sits in the header at this window size
    box.send_keys("replace")
    seen: list[str] = []

    def found(d: Any) -> bool:
        # The result list is re-rendered while the search index loads, so links
        # read a moment ago may be gone: read them afresh on every poll.
        try:
            seen[:] = [
                a.get_attribute("href") or ""
                for a in d.find_elements(By.CSS_SELECTOR, "li.md-search-result__item a")
            ]
        except StaleElementReferenceException:
            return False
        return any("api/core/" in h and "jaxstruct.core.Struct.replace" in h for h in seen)

    try:
        _wait(browser, found)
    except TimeoutException:
        pytest.fail(f"search for 'replace' never listed Struct.replace; results: {seen}")
