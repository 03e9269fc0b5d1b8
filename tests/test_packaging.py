"""Repository shape: namespace packages, py.typed, lockstep versions, version ranges, layers."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
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


def _compatible_range(version: str) -> str:
    """The range our distributions require each other in: this version up to the next minor."""
    major, minor, _ = version.split(".")
    return f">={version},<{major}.{int(minor) + 1}"


@pytest.mark.parametrize("layer", LAYERS)
def test_internal_requirements_are_compatible_ranges(layer: str) -> None:
    """Dependencies on our own distributions are compatible ranges (>= this version, below
    the next minor), so one layer's patch release installs beside the others."""
    project = _project(ROOT / "packages" / layer / "pyproject.toml")
    for name, spec in _our_requirements(project).items():
        assert spec == _compatible_range(project["version"]), f"{layer}: {name}{spec}"


def test_umbrella_requires_every_layer_in_a_compatible_range() -> None:
    """The root jaxstruct distribution requires every layer, each in a compatible range."""
    project = _project(ROOT / "pyproject.toml")
    pins = _our_requirements(project)
    assert set(pins) == {f"jaxstruct-{layer}" for layer in LAYERS}
    assert all(spec == _compatible_range(project["version"]) for spec in pins.values()), pins


def test_workspace_members_are_the_packages() -> None:
    """The uv workspace is packages/* (what we publish) and maps every layer to the
    workspace; the example plugins are editable path sources, never workspace members."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["uv"]["workspace"]["members"] == ["packages/*"]
    sources = config["tool"]["uv"]["sources"]
    assert all(sources[f"jaxstruct-{layer}"] == {"workspace": True} for layer in LAYERS)
    for plugin in ("datetime", "tar"):
        assert sources[f"jaxstruct-plugin-{plugin}"] == {
            "path": f"examples/plugin_{plugin}",
            "editable": True,
        }


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


@pytest.mark.parametrize("path", _layer_sources("io"), ids=lambda p: p.name)
def test_io_has_no_special_case_for_the_format_plugins(path: Path) -> None:
    """jaxstruct.io never imports the orbax or safetensors plugins: they register themselves."""
    imports = _imports(path)
    assert not _uses(imports, "orbax") and not _uses(imports, "safetensors")


def test_safetensors_keeps_the_core_floors() -> None:
    """jaxstruct-safetensors raises no JAX floor, so the run without orbax still reaches
    JAX 0.4.36: its one dependency beyond the layers is the safetensors library (whose own
    requirements are all optional extras), from 0.8.0, the first with ``TensorSpec``, and
    ml_dtypes (bfloat16, float8) from 0.5.0, the first with wheels for Python 3.13, and
    zlib-ng (the CRC-32 of every piece of every tensor), as jaxstruct-io has it."""
    project = _project(ROOT / "packages" / "safetensors" / "pyproject.toml")
    names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in project["dependencies"]}
    assert names == {"jaxstruct-io", "jax", "numpy", "safetensors", "ml_dtypes", "zlib-ng"}
    assert "ml_dtypes>=0.5.0" in project["dependencies"]
    assert "safetensors>=0.8.0" in project["dependencies"]
    assert project["entry-points"]["jaxstruct.io"] == {
        "safetensors": "jaxstruct.safetensors._plugin"
    }


# -- supported Pythons, CI --------------------------------------------------------------

SCRIPTS = ROOT / "scripts"
DISTRIBUTIONS = [
    ROOT,
    *PACKAGES,
    *sorted(p for p in (ROOT / "examples").iterdir() if (p / "pyproject.toml").is_file()),
]
PYTHON_CLASSIFIER = re.compile(r"^Programming Language :: Python :: (3\.\d+)$")


def _script_list(name: str) -> list[str]:
    """A space-separated list assigned at the top level of scripts/test.sh."""
    match = re.search(rf'^{name}="([^"]*)"$', (SCRIPTS / "test.sh").read_text(), re.M)
    assert match, f"scripts/test.sh assigns no {name}"
    return match.group(1).split()


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


SUPPORTED = sorted(_script_list("SUPPORTED_PYTHONS"), key=_version_key)


@pytest.mark.parametrize("path", DISTRIBUTIONS, ids=lambda p: p.name)
def test_classifiers_list_the_tested_pythons(path: Path) -> None:
    """Every distribution's classifiers name exactly the Pythons scripts/test.sh tests on."""
    classifiers = _project(path / "pyproject.toml").get("classifiers", [])
    listed = [m.group(1) for c in classifiers if (m := PYTHON_CLASSIFIER.match(c))]
    assert listed == SUPPORTED, path.name
    assert "Programming Language :: Python :: Implementation :: CPython" in classifiers


@pytest.mark.parametrize("path", DISTRIBUTIONS, ids=lambda p: p.name)
def test_requires_python_starts_at_the_oldest_tested(path: Path) -> None:
    """requires-python allows exactly the oldest tested Python and up."""
    assert _project(path / "pyproject.toml")["requires-python"] == f">={SUPPORTED[0]}"


def test_floors_are_tested_on_the_oldest_and_newest_python() -> None:
    """The lowest-versions run covers the oldest and the newest supported Python."""
    lowest = _script_list("LOWEST_PYTHONS")
    assert {SUPPORTED[0], SUPPORTED[-1]} <= set(lowest) <= set(SUPPORTED)


def test_floors_without_orbax_are_tested_on_the_oldest_python() -> None:
    """The run without jaxstruct-orbax (the other layers' JAX floor) covers the oldest Python."""
    lowest_core = _script_list("LOWEST_CORE_PYTHONS")
    assert {SUPPORTED[0]} <= set(lowest_core) <= set(SUPPORTED)


def test_floors_run_only_the_orbax_tests_where_the_run_without_orbax_runs_the_rest() -> None:
    """Where the floors' run with jaxstruct-orbax runs only the orbax tests, the run without
    it runs every other test on the same Python: no test is left out of the floors there."""
    only_orbax = set(_script_list("LOWEST_ONLY_ORBAX_PYTHONS"))
    assert only_orbax <= set(_script_list("LOWEST_PYTHONS"))
    assert only_orbax <= set(_script_list("LOWEST_CORE_PYTHONS"))


def test_without_orbax_takes_orbax_out_of_the_root_project(tmp_path: Path) -> None:
    """scripts/without_orbax.py still applies to the root pyproject.toml, and leaves no orbax."""
    copy = tmp_path / "pyproject.toml"
    shutil.copy(ROOT / "pyproject.toml", copy)
    subprocess.run(
        [sys.executable, str(SCRIPTS / "without_orbax.py"), str(copy)], check=True, timeout=60
    )
    edited = tomllib.loads(copy.read_text())
    original = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert edited["project"]["dependencies"] == [
        d for d in original["project"]["dependencies"] if not d.startswith("jaxstruct-orbax")
    ]
    assert "jaxstruct-orbax" not in edited["tool"]["uv"]["sources"]
    assert edited["tool"]["uv"]["workspace"]["exclude"] == ["packages/orbax"]
    assert "orbax" not in str(edited["dependency-groups"])


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends by running the README's test command, word for word."""
    readme = (ROOT / "README.md").read_text()
    command = "uv run --frozen --all-packages bash scripts/test.sh"
    assert f"\n{command}\n" in readme
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert [line for line in lines if line and not line.startswith("#")][-1] == command


def test_installation_page_names_the_tested_pythons_and_jax_floor() -> None:
    """docs/installation.md names every tested Python and the JAX floor the packages declare."""
    page = (ROOT / "docs" / "installation.md").read_text()
    assert f"CPython {', '.join(SUPPORTED[:-1])} and {SUPPORTED[-1]}" in page
    floors = {
        req
        for p in PACKAGES
        for req in _project(p / "pyproject.toml")["dependencies"]
        if re.match(r"jax\s*>=", req)
    }
    assert floors, "no package declares a JAX floor"
    for floor in floors:
        assert f"`{floor}`" in page, floor


def _find_python(version: str, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        ["bash", str(SCRIPTS / "find_python.sh"), version],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_find_python_finds_the_running_interpreter() -> None:
    """scripts/find_python.sh finds a CPython of the running version and prints its path."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = _find_python(version, ci=None)
    assert found.returncode == 0, found.stderr
    path = found.stdout.strip()
    reported = subprocess.run(
        [path, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert reported.stdout.strip() == str(sys.version_info[:2])


def test_find_python_skips_a_missing_interpreter_outside_ci() -> None:
    """Outside CI a missing interpreter is a warning and exit status 2 (skip)."""
    found = _find_python("3.99", ci=None)
    assert (found.returncode, found.stdout) == (2, "")
    assert "warning: CPython 3.99 not found" in found.stderr and "skipping" in found.stderr


def test_find_python_fails_on_a_missing_interpreter_in_ci() -> None:
    """With CI=true a missing interpreter is an error and exit status 1."""
    found = _find_python("3.99", ci="true")
    assert (found.returncode, found.stdout) == (1, "")
    assert (
        "error: CPython 3.99 not found" in found.stderr and "install CPython 3.99" in found.stderr
    )
