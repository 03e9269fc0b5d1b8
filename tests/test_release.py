"""Release readiness: what `uv build` makes is what PyPI users get, and it installs beside anything.

Runs once in CI (part 1 of scripts/test.sh): it builds every distribution and installs
them into a fresh virtual environment, which takes about half a minute.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())
LAYERS = [p.name for p in PACKAGES]
REPOSITORY = "https://github.com/jaxstruct/jaxstruct"

# Imports a layer may make without declaring the distribution, and why.
UNDECLARED_IMPORTS = {
    # core's mypy plugin runs inside mypy, which loads it; nothing imports it otherwise.
    ("core", "mypy"),
    # core's treescope display is set up only when treescope is already imported.
    ("core", "treescope"),
    # testing's pytest plugin module is loaded by pytest itself (the pytest11 entry point).
    ("testing", "pytest"),
    # testing reads jaxtyping annotations only when the user's code imported jaxtyping.
    ("testing", "jaxtyping"),
}


def _project(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _third_party_imports(layer: str) -> set[str]:
    """Top-level modules a layer's sources import, standard library and jaxstruct left out."""
    found: set[str] = set()
    for path in (ROOT / "packages" / layer / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    # annotationlib is the standard library's from Python 3.14 on (imported when present).
    return found - set(sys.stdlib_module_names) - {"jaxstruct", "annotationlib"}


@pytest.mark.parametrize("layer", LAYERS)
def test_every_imported_package_is_declared(layer: str) -> None:
    """Each third-party module a layer imports comes from a distribution it declares
    (as a dependency or in an extra), or is listed above with the reason it need not."""
    project = _project(ROOT / "packages" / layer)
    declared = {_name(r) for r in project.get("dependencies", [])}
    for extra in project.get("optional-dependencies", {}).values():
        declared |= {_name(r) for r in extra}
    owners = packages_distributions()
    missing = []
    for module in sorted(_third_party_imports(layer)):
        if (layer, module) in UNDECLARED_IMPORTS:
            continue
        distributions = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
        if not distributions & declared:
            missing.append(f"{module} (from {sorted(distributions)})")
    assert not missing, f"jaxstruct-{layer} imports undeclared packages: {missing}"


@pytest.mark.parametrize("path", [ROOT, *PACKAGES], ids=lambda p: p.name)
def test_license_and_project_metadata(path: Path) -> None:
    """Every distribution carries the Apache-2.0 LICENSE file, authors and project URLs."""
    project = _project(path)
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert (path / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert project["authors"]
    assert project["urls"]["Repository"] == REPOSITORY


@pytest.mark.parametrize("path", [ROOT, *PACKAGES], ids=lambda p: p.name)
def test_readme_links_work_on_pypi(path: Path) -> None:
    """A distribution's README links only to absolute URLs (PyPI shows it away from the
    repository, where a relative link leads nowhere), and each repository link names a
    file that exists."""
    text = (path / _project(path)["readme"]).read_text()
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert re.match(r"https?://", target), f"{path.name}/README.md links to {target!r}"
        if target.startswith(f"{REPOSITORY}/blob/main/"):
            assert (ROOT / target.removeprefix(f"{REPOSITORY}/blob/main/")).exists(), target


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every distribution `uv build --all-packages` makes, wheels and sdists."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        ["uv", "build", "--all-packages", "--quiet", "-o", str(out)],
        cwd=ROOT,
        check=True,
        timeout=600,
    )
    return out


def test_only_the_layers_and_the_umbrella_are_built(built: Path) -> None:
    """`uv build --all-packages` builds the seven layers and the umbrella, never the
    example plugins."""
    wheels = sorted(p.name.split("-")[0] for p in built.glob("*.whl"))
    assert wheels == sorted(["jaxstruct", *(f"jaxstruct_{layer}" for layer in LAYERS)])
    assert len(list(built.glob("*.tar.gz"))) == len(wheels)


def test_every_wheel_and_sdist_carries_the_license(built: Path) -> None:
    """The LICENSE file is in every wheel (its .dist-info) and every sdist."""
    for wheel in built.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            assert any(n.endswith(".dist-info/licenses/LICENSE") for n in archive.namelist()), wheel
    for sdist in built.glob("*.tar.gz"):
        with tarfile.open(sdist) as archive:
            assert any(n.endswith("/LICENSE") for n in archive.getnames()), sdist


def test_each_sdist_holds_its_own_package(built: Path) -> None:
    """A layer's sdist holds its own sources and nothing of the other layers; the
    umbrella's holds no code at all (not the repository)."""
    for sdist in built.glob("*.tar.gz"):
        with tarfile.open(sdist) as archive:
            names = [n.split("/", 1)[1] for n in archive.getnames() if "/" in n]
        if sdist.name.startswith("jaxstruct-"):
            assert not [n for n in names if n.endswith(".py")], names
            assert len(names) < 10, names
            continue
        layer = sdist.name.removeprefix("jaxstruct_").split("-")[0]
        sources = {n for n in names if n.startswith("src/")}
        assert sources and all(n.startswith(f"src/jaxstruct/{layer}/") for n in sources), names
        assert not [n for n in names if n.startswith(("tests/", "docs/", "examples/"))], names


def _bump_patch(source: Path, into: Path) -> Path:
    """A copy of the distribution at ``source`` with its version's patch number raised."""
    copy = into / source.name
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    text = (copy / "pyproject.toml").read_text()
    version = _project(source)["version"]
    major, minor, patch = (int(p) for p in version.split("."))
    bumped = f"{major}.{minor}.{patch + 1}"
    (copy / "pyproject.toml").write_text(
        text.replace(f'version = "{version}"', f'version = "{bumped}"', 1)
    )
    return copy


SMOKE = """
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
from importlib.metadata import version

class Point(js.Struct):
    x: object
    label: str = js.field(static=True, default="p")

p = Point(jnp.arange(3.0))
jio.export(p, "point.zip")
q = jio.load("point.zip")
assert (q.x == p.x).all() and q.label == "p"
print(version("jaxstruct-core"), version("jaxstruct"))
"""


def test_one_layer_at_a_newer_patch_installs_beside_the_others(built: Path, tmp_path: Path) -> None:
    """jaxstruct-core one patch release ahead installs beside the umbrella and every
    other layer at today's version (the layers require each other as compatible ranges),
    and a struct exports and loads there."""
    bumped = _bump_patch(ROOT / "packages" / "core", tmp_path)
    wheels = tmp_path / "wheels"
    shutil.copytree(built, wheels)
    for old in wheels.glob("jaxstruct_core-*"):
        old.unlink()
    subprocess.run(
        ["uv", "build", "--wheel", "--quiet", "-o", str(wheels), str(bumped)],
        check=True,
        timeout=300,
    )
    venv = tmp_path / "venv"
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    subprocess.run(
        ["uv", "venv", "--quiet", "--python", sys.executable, str(venv)],
        check=True,
        timeout=300,
        env=env,
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            "--find-links",
            str(wheels),
            "jaxstruct",
            "jaxstruct-core==0.1.1",
        ],
        check=True,
        timeout=600,
        env=env,
    )
    subprocess.run(
        ["uv", "pip", "check", "--python", str(python)], check=True, timeout=300, env=env
    )
    smoke = subprocess.run(
        [str(python), "-c", SMOKE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert smoke.returncode == 0, smoke.stderr
    assert smoke.stdout.split() == ["0.1.1", "0.1.0"]
