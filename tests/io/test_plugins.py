"""Plugins: pluggy hooks, entry points, duplicates, failures, autoload, the example plugin."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import pytest
from jaxstruct.io import Codec, PluginError, PluginRegistry, PluginWarning, hookimpl
from jaxstruct.registry import SerializationError


class Money:
    def __init__(self, cents: int) -> None:
        self.cents = cents


class Euro(Money):
    pass


@dataclasses.dataclass
class FakeDist:
    name: str


@dataclasses.dataclass
class FakeEntryPoint:
    """Stands in for an installed distribution's entry point."""

    name: str
    dist: FakeDist
    plugin: Any = None
    error: BaseException | None = None
    loads: int = 0

    def load(self) -> Any:
        self.loads += 1
        if self.error is not None:
            raise self.error
        return self.plugin


def _codec_plugin(name: str, cls: type = Money) -> types.SimpleNamespace:
    codec = Codec(name, (cls,), encode=lambda m: m.cents, decode=Money)

    @hookimpl
    def jaxstruct_register_codecs() -> list[Codec]:
        return [codec]

    return types.SimpleNamespace(jaxstruct_register_codecs=jaxstruct_register_codecs)


def test_builtin_formats_are_registered_through_the_hook() -> None:
    """The directory and zip formats come from the built-in plugin, like any other."""
    reg = PluginRegistry(entry_points=list)
    assert sorted(reg.formats) == ["directory", "zip"]
    assert "built-in" in reg.source_of("format", "zip")
    assert reg.manager.get_plugin("jaxstruct-io-builtins") is not None


def test_entry_point_plugins_load_lazily_and_once() -> None:
    """Entry points are loaded on first use, once."""
    ep = FakeEntryPoint("money", FakeDist("jaxstruct-money"), plugin=_codec_plugin("money"))
    reg = PluginRegistry(entry_points=lambda: [ep], autoload=True)
    assert ep.loads == 0
    assert reg.codec_for_type(Money) is reg.codecs["money"]
    reg.codec_named("money")
    assert ep.loads == 1
    assert reg.source_of("codec", "money") == "jaxstruct-money"


def test_duplicate_names_name_both_distributions() -> None:
    """Two plugins registering one codec name is an error naming both distributions, where
    the name is used; collecting them warns nothing (a process that never uses it)."""
    eps = [
        FakeEntryPoint("a", FakeDist("dist-one"), plugin=_codec_plugin("money")),
        FakeEntryPoint("b", FakeDist("dist-two"), plugin=_codec_plugin("money", cls=Euro)),
    ]
    reg = PluginRegistry(entry_points=lambda: eps, autoload=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)
        assert "money" not in reg.codecs
    for _ in range(2):  # the same true error every time, not a poisoned registry
        with pytest.raises(PluginError, match=r"codec name 'money'.*'dist-one'.*'dist-two'"):
            reg.codec_named("money")
    assert sorted(reg.formats) == ["directory", "zip"]


def test_duplicate_format_name_with_builtin_is_an_error() -> None:
    """A plugin format named like a built-in one is refused, naming both sources where the
    name is used."""

    class Fake(jio.Format):
        name = "zip"

    plugin = types.SimpleNamespace(jaxstruct_register_formats=hookimpl(lambda: [Fake()]))
    ep = FakeEntryPoint("f", FakeDist("dist-fmt"), plugin=plugin)
    reg = PluginRegistry(entry_points=lambda: [ep], autoload=True)
    assert type(reg.formats["zip"]) is jio._builtin.ZipFormat
    with pytest.warns(PluginWarning, match=r"built-in.*'dist-fmt'.*the built-in one is kept"):
        assert type(reg.format_named("zip")) is jio._builtin.ZipFormat
    assert reg.source_of("format", "zip") == "jaxstruct-io (built-in)"


def test_plugin_that_fails_to_import_raises() -> None:
    """A plugin whose import fails raises PluginError naming the plugin and its distribution."""
    ep = FakeEntryPoint("broken", FakeDist("dist-broken"), error=ImportError("no module named x"))
    reg = PluginRegistry(entry_points=lambda: [ep], autoload=True)
    with pytest.warns(PluginWarning, match=r"'broken'.*'dist-broken'.*no module named x"):
        assert sorted(reg.formats) == ["directory", "zip"]
    (info,) = [p for p in reg.plugins() if p.name == "broken"]
    assert info.state == "failed" and "no module named x" in info.reason
    assert "'broken' from 'dist-broken'" in reg.missing_hint()


def test_environment_variable_disables_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD keeps entry points from loading."""
    monkeypatch.setenv(jio.AUTOLOAD_ENV, "1")
    ep = FakeEntryPoint("broken", FakeDist("d"), error=ImportError("boom"))
    reg = PluginRegistry(entry_points=lambda: [ep])
    assert sorted(reg.formats) == ["directory", "zip"]
    assert ep.loads == 0


def test_non_codec_return_value_is_refused() -> None:
    """A hook returning something that is not a Codec is a PluginError."""
    plugin = types.SimpleNamespace(jaxstruct_register_codecs=hookimpl(lambda: ["nope"]))
    reg = PluginRegistry(
        entry_points=lambda: [FakeEntryPoint("x", FakeDist("dx"), plugin=plugin)], autoload=True
    )
    with pytest.warns(PluginWarning, match="'x' from distribution 'dx' failed.*Codec"):
        assert reg.codecs == {}


def test_unregistered_codec_in_manifest_is_refused() -> None:
    """A manifest naming a codec nobody registered is a SerializationError, never an import."""
    payload = jio.to_state_dict([1])
    payload["manifest"]["nodes"] = [["int", 5], ["codec", "some.module.Codec", 0]]
    payload["manifest"]["root"] = 1
    with pytest.raises(SerializationError, match="not registered"):
        jio.from_state_dict(payload)


def test_register_codec_round_trips_a_new_type(tmp_path: Path) -> None:
    """register_codec makes a new type storable in all forms."""

    class Celsius(float):
        pass

    jio.register_codec(Codec("tests.celsius", (Celsius,), encode=float, decode=Celsius))
    path = jio.export({"t": Celsius(21.5)}, tmp_path / "c.zip")
    out = jio.load(path)["t"]
    assert type(out) is Celsius and out == 21.5
    with pytest.raises(PluginError, match="both handle"):
        jio.register_codec(Codec("tests.celsius2", (Celsius,), encode=float, decode=Celsius))


EXAMPLE = "jaxstruct-plugin-datetime"


def _example_installed() -> bool:
    try:
        importlib.metadata.distribution(EXAMPLE)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_example_plugin_is_installed_with_its_entry_point() -> None:
    """The example distribution is installed and advertises a jaxstruct.io entry point."""
    assert _example_installed(), (
        f"{EXAMPLE} is not installed; it is a workspace dev dependency: "
        "run `uv sync --all-packages`"
    )
    eps = importlib.metadata.entry_points(group="jaxstruct.io")
    assert any(ep.dist is not None and ep.dist.name == EXAMPLE for ep in eps)


SCRIPT = textwrap.dedent(
    """
    import datetime, decimal, sys, zoneinfo
    import jaxstruct.io as jio
    value = {
        "when": datetime.datetime(
            2024, 5, 6, 7, 8, 9, 10, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")
        ),
        "day": datetime.date(2000, 2, 29),
        "span": datetime.timedelta(days=-1, microseconds=5),
        "price": decimal.Decimal("-12.3400"),
    }
    if sys.argv[1] == "export":
        jio.export(value, sys.argv[2])
    else:
        assert jio.load(sys.argv[2]) == value, jio.load(sys.argv[2])
        print("ok")
    """
)


def test_example_plugin_end_to_end(tmp_path: Path) -> None:
    """Installed, the example plugin lets fresh processes export and load datetime and Decimal."""
    path = str(tmp_path / "dt.zip")
    env = {k: v for k, v in os.environ.items() if k != jio.AUTOLOAD_ENV}
    subprocess.run([sys.executable, "-c", SCRIPT, "export", path], check=True, env=env)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, "load", path],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "ok"
    info = jio.inspect(path)
    assert "<codec 'jaxstruct_plugin_datetime.datetime'>" in info.tree


def test_example_plugin_not_loaded_when_autoload_is_off(tmp_path: Path) -> None:
    """With autoload disabled, datetime values are refused at export."""
    env = {**os.environ, jio.AUTOLOAD_ENV: "1"}
    result = subprocess.run(  # noqa: PLW1510 - the exit status is what is asserted
        [sys.executable, "-c", SCRIPT, "export", str(tmp_path / "x.zip")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "SerializationError" in result.stderr


# -- hooks pluggy would skip without a word (issue 11, item 17) ------------------------------


def _empty_hook() -> Any:
    """A fresh function returning no items (each marker test gets its own function object)."""

    def hook() -> list[Any]:
        return []

    return hook


def _registry_of(plugin: Any, name: str = "sloppy") -> PluginRegistry:
    ep = FakeEntryPoint(name, FakeDist(f"dist-{name}"), plugin=plugin)
    return PluginRegistry(entry_points=lambda: [ep], autoload=True)


def _failed_state(reg: PluginRegistry, name: str = "sloppy") -> str:
    (info,) = [p for p in reg.plugins() if p.name == name]
    return info.state


def _refused(plugin: Any, match: str, name: str = "sloppy") -> PluginRegistry:
    """Collect ``plugin``: it is failed with a warning matching ``match``; the built-ins work."""
    reg = _registry_of(plugin, name)
    with pytest.warns(PluginWarning, match=match):
        assert {"directory", "zip"} <= set(reg.formats)
    assert _failed_state(reg, name) == "failed"
    return reg


def test_misspelled_hook_is_an_error_naming_plugin_and_hook() -> None:
    """A marked hook with a misspelled name fails the plugin, naming plugin, hook and the fix."""
    plugin = types.SimpleNamespace(jaxstruct_register_codec=hookimpl(_empty_hook()))
    _refused(
        plugin,
        r"'sloppy' from distribution 'dist-sloppy' failed.*implements 'jaxstruct_register_codec'"
        r".*did you mean 'jaxstruct_register_codecs'",
    )


def test_marked_function_with_a_foreign_name_is_an_error() -> None:
    """A function with our marker and a name that is no hook at all is refused."""
    plugin = types.SimpleNamespace(register_formats=hookimpl(_empty_hook()))
    _refused(plugin, r"'register_formats', which is not a jaxstruct.io hook")


def test_hook_without_marker_is_an_error() -> None:
    """A jaxstruct_* function without the hookimpl marker is refused, naming the decorator."""

    def jaxstruct_register_codecs() -> list[Codec]:
        return []

    plugin = types.SimpleNamespace(jaxstruct_register_codecs=jaxstruct_register_codecs)
    _refused(plugin, r"has no hookimpl marker.*@jaxstruct.io.hookimpl")


def test_hook_with_another_projects_marker_is_an_error() -> None:
    """A jaxstruct_* function marked with another project's hookimpl is refused, naming it."""
    import pluggy

    other = pluggy.HookimplMarker("pytest")
    plugin = types.SimpleNamespace(jaxstruct_register_formats=other(_empty_hook()))
    _refused(plugin, r"marker of 'pytest' instead of jaxstruct's")


def test_module_plugin_with_a_misspelled_hook_is_refused() -> None:
    """Module plugins (the usual entry-point target) are checked the same way."""
    module = types.ModuleType("jaxstruct_plugin_sloppy")
    module.jaxstruct_register_format = hookimpl(_empty_hook())  # type: ignore[attr-defined]
    _refused(module, "'jaxstruct_register_format'", "modplug")


def test_hook_with_wrong_arguments_is_our_error() -> None:
    """A hook whose arguments are not in the specification fails the plugin, in our words."""
    plugin = types.SimpleNamespace(jaxstruct_register_codecs=hookimpl(lambda config: []))
    _refused(plugin, r"'sloppy'.*does not fit its hook specification")


def test_refused_plugin_is_not_half_registered() -> None:
    """A plugin refused for a bad hook leaves no registration behind."""
    good = _codec_plugin("money")
    good.jaxstruct_register_codec = hookimpl(_empty_hook())
    reg = _refused(good, "jaxstruct_register_codec")
    assert "money" not in reg.codecs
    assert reg.manager.get_plugin("entrypoint:sloppy") is None


def test_well_formed_plugin_with_helpers_is_accepted() -> None:
    """Unmarked helpers without the hook prefix, and correct hooks, pass the check."""
    plugin = _codec_plugin("money")
    plugin.helper = lambda: None
    assert "money" in _registry_of(plugin).codecs


def test_example_plugin_round_trips_with_assert_roundtrip(tmp_path: Path) -> None:
    """The datetime example, as loaded in this process, passes assert_roundtrip everywhere."""
    import datetime
    import decimal

    from jaxstruct.testing import assert_roundtrip

    value = {
        "when": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
        "price": decimal.Decimal("-1.50"),
    }
    assert_roundtrip(value, formats=("state_dict", "directory", "zip", "tar"), tmp_path=tmp_path)
    codecs = jio.current_registry().codecs
    assert all(n.startswith("jaxstruct_plugin_datetime.") for n in codecs if "datetime" in n)


def _register_here(reg: PluginRegistry, codec: Codec) -> None:
    # As register_codec() does: the registration's origin is the module two frames up.
    reg._register_single(codec, "register_codec")


def test_a_rerun_registration_replaces_and_a_clashing_one_changes_nothing() -> None:
    """register_codec() run again from the same module (a re-run notebook cell) replaces its
    earlier codec; a re-run that clashes with another codec is refused and leaves the earlier
    one in place for every query."""
    reg = PluginRegistry(entry_points=list)
    first = Codec("t.money", (Money,), encode=lambda m: m.cents, decode=Money)
    again = Codec("t.money", (Money,), encode=lambda m: m.cents, decode=Money)
    euro = Codec("t.euro", (Euro,), encode=lambda m: m.cents, decode=Euro)
    _register_here(reg, first)
    _register_here(reg, again)
    _register_here(reg, euro)
    assert reg.codec_named("t.money") is again and reg.codecs["t.money"] is again
    clashing = Codec("t.money", (Money, Euro), encode=lambda m: m.cents, decode=Money)
    with pytest.raises(PluginError, match="both handle Euro"):
        _register_here(reg, clashing)
    assert reg.codec_named("t.money") is again and reg.codecs["t.money"] is again
    assert reg.codec_for_type(Money) is again and reg.codec_for_type(Euro) is euro
    runtime = [p.codecs for p in reg.plugins() if p.name == "register_codec()"]
    assert runtime == [("t.money",), ("t.euro",)]


def test_plugin_module_getattr_raising_import_error_costs_only_itself(tmp_path: Path) -> None:
    lazy = types.ModuleType("lazy_plugin")

    def _lazy_getattr(name: str) -> Any:
        raise ImportError(f"optional dependency for {name!r} is not installed")

    lazy.__getattr__ = _lazy_getattr  # type: ignore[method-assign]

    @hookimpl
    def jaxstruct_register_codecs() -> list[Codec]:
        return []

    lazy.jaxstruct_register_codecs = jaxstruct_register_codecs  # type: ignore[attr-defined]
    reg = _refused(
        lazy, r"plugin 'sloppy' from distribution 'dist-sloppy'.*ImportError.*AttributeError"
    )
    assert {"directory", "zip"} <= set(reg.formats)


def test_format_whose_suffixes_property_raises_costs_only_itself() -> None:
    class Flaky(jio.Format):
        name = "flaky"

        @property
        def suffixes(self) -> tuple[str, ...]:  # type: ignore[override]
            raise RuntimeError("config not loaded")

    plugin = types.SimpleNamespace(jaxstruct_register_formats=hookimpl(lambda: [Flaky()]))
    reg = _refused(plugin, r"plugin 'sloppy'.*Flaky.*RuntimeError: config not loaded")
    assert reg.format_for_suffix(".zip") is not None


def test_plugin_whose_attributes_cannot_be_listed_is_refused() -> None:
    class Hostile:
        def __dir__(self) -> list[str]:
            raise ValueError("no listing")

    _refused(Hostile(), r"plugin 'sloppy'.*ValueError: no listing")


def test_format_whose_name_property_raises_in_register_format_is_a_plugin_error() -> None:
    class Nameless(jio.Format):
        suffixes = (".nl",)

        @property
        def name(self) -> str:  # type: ignore[override]
            raise KeyError("name")

    reg = PluginRegistry(entry_points=list, autoload=True)
    with pytest.raises(PluginError, match="KeyError"):
        reg._register_single(Nameless(), "register_format")  # pyright: ignore[reportPrivateUsage]


def test_format_listing_a_suffix_twice_in_two_cases_does_not_clash_with_itself() -> None:
    class H5(jio.Format):
        name = "h5x"
        suffixes = (".h5", ".H5")

    fmt = H5()

    @hookimpl
    def jaxstruct_register_formats() -> list[jio.Format]:
        return [fmt]

    plugin = types.SimpleNamespace(jaxstruct_register_formats=jaxstruct_register_formats)
    reg = _registry_of(plugin, "h5x")

    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)
        assert reg.format_for_suffix(".h5") is fmt
    assert reg.format_for_suffix(".H5") is fmt
    assert _failed_state(reg, "h5x") == "loaded"


class _TarGz(jio.Format):
    name = "targz"
    suffixes = (".tar.gz",)


def test_format_claiming_a_multi_dot_suffix_is_refused_naming_the_last_suffix() -> None:
    @hookimpl
    def jaxstruct_register_formats() -> list[jio.Format]:
        return [_TarGz()]

    plugin = types.SimpleNamespace(jaxstruct_register_formats=jaxstruct_register_formats)
    reg = _refused(plugin, r"plugin 'targz'.*'\.tar\.gz'.*last suffix.*'\.gz'", name="targz")
    assert ".tar.gz" not in reg.suffixes


def test_register_format_refuses_a_multi_dot_suffix() -> None:
    reg = PluginRegistry(entry_points=list, autoload=True)
    with pytest.raises(PluginError, match=r"'\.tar\.gz'.*claim '\.gz'"):
        reg._register_single(_TarGz(), "register_format")  # pyright: ignore[reportPrivateUsage]


def test_a_clash_is_listed_on_both_plugins() -> None:
    """After two plugins register one name, plugins() shows the clash on the first one too
    (it was listed as loaded with no problem)."""
    eps = [
        FakeEntryPoint("a", FakeDist("dist-one"), plugin=_codec_plugin("money")),
        FakeEntryPoint("b", FakeDist("dist-two"), plugin=_codec_plugin("money", cls=Euro)),
    ]
    reg = PluginRegistry(entry_points=lambda: eps, autoload=True)
    infos = {p.name: p for p in reg.plugins()}
    for name in ("a", "b"):
        assert any(
            "codec name 'money'" in problem and "'dist-one'" in problem and "'dist-two'" in problem
            for problem in infos[name].problems
        ), infos[name]
    assert "problem: codec name 'money'" in str(infos["a"])
