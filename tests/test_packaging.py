"""Repository shape: namespace packages, py.typed, lockstep versions, exact pins, layering."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())
LAYERS = [p.name for p in PACKAGES]
OUR = re.compile(r"^(jaxstruct(?:-[a-z]+)?)\s*(.*)$")


def _project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def _our_requirements(project: dict) -> dict[str, str]:
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    out: dict[str, str] = {}
    for req in reqs:
        match = OUR.match(req.split(";")[0].strip())
        if match and match.group(1).startswith("jaxstruct"):
            out[match.group(1)] = match.group(2).strip()
    return out


def _imports(path: Path) -> set[str]:
    """Absolute modules imported by a source file (relative imports stay in the layer)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _layer_sources(layer: str) -> list[Path]:
    return sorted((ROOT / "packages" / layer / "src" / "jaxstruct" / layer).rglob("*.py"))


def _uses(imports: set[str], layer: str) -> bool:
    return any(m == f"jaxstruct.{layer}" or m.startswith(f"jaxstruct.{layer}.") for m in imports)


def test_expected_layers_exist() -> None:
    """The workspace has the registry, core, io, abc and testing packages."""
    assert {"registry", "core", "io", "abc"} <= set(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_no_jaxstruct_init(layer: str) -> None:
    """jaxstruct is a PEP 420 namespace: no package ships jaxstruct/__init__.py."""
    assert not (ROOT / "packages" / layer / "src" / "jaxstruct" / "__init__.py").exists()


@pytest.mark.parametrize("layer", LAYERS)
def test_nothing_directly_in_namespace(layer: str) -> None:
    """Nothing but layer packages sits directly in src/jaxstruct/."""
    entries = [p.name for p in (ROOT / "packages" / layer / "src" / "jaxstruct").iterdir()]
    assert [e for e in entries if e != "__pycache__"] == [layer]


@pytest.mark.parametrize("layer", LAYERS)
def test_py_typed_present(layer: str) -> None:
    """Every layer ships a py.typed marker."""
    assert (ROOT / "packages" / layer / "src" / "jaxstruct" / layer / "py.typed").is_file()


@pytest.mark.parametrize("layer", LAYERS)
def test_distribution_name_matches_layer(layer: str) -> None:
    """packages/<layer> is the distribution jaxstruct-<layer>."""
    assert _project(ROOT / "packages" / layer / "pyproject.toml")["name"] == f"jaxstruct-{layer}"


def test_lockstep_versions() -> None:
    """Every distribution, the umbrella included, has the same version."""
    versions = {_project(p / "pyproject.toml")["version"] for p in PACKAGES}
    versions.add(_project(ROOT / "pyproject.toml")["version"])
    assert len(versions) == 1, versions


@pytest.mark.parametrize("layer", LAYERS)
def test_internal_pins_are_exact(layer: str) -> None:
    """Dependencies on our own distributions are exact == pins of the lockstep version."""
    project = _project(ROOT / "packages" / layer / "pyproject.toml")
    for name, spec in _our_requirements(project).items():
        assert spec == f"=={project['version']}", f"{layer}: {name}{spec}"


def test_umbrella_pins_every_layer_exactly() -> None:
    """The root jaxstruct distribution depends on every layer with an exact pin."""
    project = _project(ROOT / "pyproject.toml")
    pins = _our_requirements(project)
    assert set(pins) == {f"jaxstruct-{layer}" for layer in LAYERS}
    assert all(spec == f"=={project['version']}" for spec in pins.values()), pins


def test_workspace_members_are_the_packages() -> None:
    """The uv workspace covers packages/* and maps every layer to the workspace."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # The example io plugins are members too, so their end-to-end tests run.
    assert config["tool"]["uv"]["workspace"]["members"] == [
        "packages/*",
        "examples/plugin_datetime",
        "examples/plugin_tar",
    ]
    sources = config["tool"]["uv"]["sources"]
    assert all(sources[f"jaxstruct-{layer}"] == {"workspace": True} for layer in LAYERS)


def test_registry_and_core_need_only_jax_numpy() -> None:
    """registry and core depend on nothing beyond jax, numpy, typing_extensions and our layers."""
    allowed = {"jax", "numpy", "typing_extensions", "typing-extensions", "jaxstruct-registry"}
    for layer in ("registry", "core"):
        project = _project(ROOT / "packages" / layer / "pyproject.toml")
        names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in project["dependencies"]}
        assert names <= allowed, (layer, names - allowed)


# -- layering ------------------------------------------------------------------------


@pytest.mark.parametrize("path", _layer_sources("registry"), ids=lambda p: p.name)
def test_registry_imports_no_higher_layer(path: Path) -> None:
    """jaxstruct.registry never imports core, io, abc or testing."""
    imports = _imports(path)
    for layer in ("core", "io", "abc", "testing"):
        assert not _uses(imports, layer), f"{path.name} imports jaxstruct.{layer}"


@pytest.mark.parametrize("path", _layer_sources("core"), ids=lambda p: p.name)
def test_core_imports_no_higher_layer_statically(path: Path) -> None:
    """jaxstruct.core never statically imports io, abc or testing."""
    imports = _imports(path)
    for layer in ("io", "abc", "testing"):
        assert not _uses(imports, layer), f"{path.name} imports jaxstruct.{layer}"


def test_core_loads_io_only_through_importlib() -> None:
    """core reaches jaxstruct.io only as a string passed to importlib.import_module."""
    mentions: set[str] = set()
    dynamic = False
    for path in _layer_sources("core"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "jaxstruct.io":
                mentions.add(path.name)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "jaxstruct.io"
            ):
                dynamic = True
    assert mentions == {"_struct.py"} and dynamic


@pytest.mark.parametrize(
    "path", _layer_sources("io") + _layer_sources("abc"), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_io_and_abc_never_import_testing(path: Path) -> None:
    """jaxstruct.io and jaxstruct.abc never import jaxstruct.testing."""
    assert not _uses(_imports(path), "testing")
