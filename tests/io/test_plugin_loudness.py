"""Plugins fail loudly and by name (issue 47): blocked or failed plugins' suffixes, the
``plugins`` command's status, entry-point name clashes, where warnings point, and codecs
whose decode does not give back their type. Also the scoped registry
(``PluginRegistry.using``) the testing kit runs plugins through.
"""

from __future__ import annotations

import dataclasses
import decimal
import fractions
import threading
import types
import warnings
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import Codec, PluginError, PluginRegistry, PluginWarning, hookimpl
from jaxstruct.io._cli import main
from jaxstruct.registry import SerializationError

VALUE = {"w": np.arange(3.0)}


@dataclasses.dataclass
class Dist:
    name: str
    version: str = "1.0"


@dataclasses.dataclass
class EntryPoint:
    """Stands in for an installed distribution's entry point (counts its imports)."""

    name: str
    dist: Dist
    plugin: Any = None
    error: BaseException | None = None
    loads: int = 0

    def load(self) -> Any:
        self.loads += 1
        if self.error is not None:
            raise self.error
        return self.plugin


class Uxc(jio.Format):
    """A format claiming a suffix no well-known list holds."""

    name = "uxc"
    suffixes = (".uxc",)


def _formats(*formats: jio.Format) -> Any:
    return types.SimpleNamespace(jaxstruct_register_formats=hookimpl(lambda: list(formats)))


def _codecs(*codecs: Codec) -> Any:
    return types.SimpleNamespace(jaxstruct_register_codecs=hookimpl(lambda: list(codecs)))


def _uxc_plugin() -> EntryPoint:
    return EntryPoint("uxc", Dist("jaxstruct-uxc"), _formats(Uxc()))


# -- a suffix of a plugin that is not loaded -----------------------------------------------


@pytest.mark.parametrize(
    ("registry", "state"),
    [
        (lambda ep: PluginRegistry(entry_points=lambda: [ep], autoload=True, block=["uxc"]), ""),
        (lambda ep: PluginRegistry(entry_points=lambda: [ep], autoload=False), "autoloading"),
    ],
    ids=["blocked", "autoload-off"],
)
def test_a_suffix_a_disabled_plugin_may_claim_is_refused(
    tmp_path: Path, registry: Any, state: str
) -> None:
    """export(x, "x.uxc") while the plugin that claims .uxc is blocked (or autoloading is off)
    writes nothing and names the plugin and its distribution; it is never imported."""
    ep = _uxc_plugin()
    with registry(ep).using():
        with pytest.raises(
            SerializationError,
            match=rf"suffix '\.uxc'.*plugin 'uxc' from distribution 'jaxstruct-uxc' "
            rf"\(disabled: .*{state}.*format=\"directory\"",
        ):
            jio.export(VALUE, tmp_path / "x.uxc")
        assert list(tmp_path.iterdir()) == []
        assert ep.loads == 0
        written = jio.export(VALUE, tmp_path / "x.uxc", format="directory")
        assert written.is_dir() and jio.load(written)["w"].tolist() == [0.0, 1.0, 2.0]


def test_a_suffix_a_failed_plugin_may_claim_is_refused(tmp_path: Path) -> None:
    """A plugin that failed to import claims nothing anyone can read: a suffix no loaded format
    claims is refused, naming it and why it failed."""
    ep = EntryPoint("uxc", Dist("jaxstruct-uxc"), error=ImportError("no module named uxclib"))
    registry = PluginRegistry(entry_points=lambda: [ep], autoload=True)
    with pytest.warns(PluginWarning), registry.using():
        with pytest.raises(
            SerializationError, match=r"'\.uxc'.*'jaxstruct-uxc' \(failed: .*uxclib"
        ):
            jio.export(VALUE, tmp_path / "x.uxc")
    assert list(tmp_path.iterdir()) == []


def test_unclaimed_suffixes_are_directories_when_every_plugin_is_loaded(tmp_path: Path) -> None:
    """With no plugin blocked or failed, a path like run.v2 is a directory checkpoint, as
    before (no plugin could claim .v2 without being loaded)."""
    with PluginRegistry(entry_points=lambda: [_uxc_plugin()], autoload=True).using():
        assert jio.export(VALUE, tmp_path / "run.v2").is_dir()


# -- `jaxstruct plugins` --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eps", "status"),
    [
        (lambda: [_uxc_plugin()], 0),
        (lambda: [EntryPoint("bad", Dist("jaxstruct-bad"), error=ImportError("boom"))], 1),
        (
            lambda: [
                EntryPoint(
                    "a", Dist("dist-a"), _codecs(Codec("m", (fractions.Fraction,), str, str))
                ),
                EntryPoint("b", Dist("dist-b"), _codecs(Codec("m", (decimal.Decimal,), str, str))),
            ],
            1,
        ),
    ],
    ids=["loaded", "failed", "clash"],
)
def test_plugins_command_fails_while_a_plugin_fails_or_clashes(
    eps: Any, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`jaxstruct plugins` exits 1 while an installed plugin failed or clashes, naming it on
    stderr; 0 when every plugin is loaded."""
    listed = eps()
    registry = PluginRegistry(entry_points=lambda: listed, autoload=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)  # (the failed one's, at collection)
        registry.plugins()
    with registry.using():
        assert main(["plugins"]) == status
    err = capsys.readouterr().err
    assert (err == "") is (status == 0), err


def test_plugins_command_lists_installed_plugins_as_disabled_when_autoload_is_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With autoloading off, every installed plugin is listed as disabled (never imported),
    with the reason; that is no failure."""
    ep = _uxc_plugin()
    with PluginRegistry(entry_points=lambda: [ep], autoload=False).using():
        assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "uxc (jaxstruct-uxc 1.0): disabled: plugin autoloading is switched off" in out
    assert ep.loads == 0


# -- entry-point names shared by two distributions ----------------------------------------


def _shared(order: list[int]) -> tuple[PluginRegistry, list[EntryPoint]]:
    eps = [
        EntryPoint("tar", Dist("tar-one"), _formats(_named_format("tar1", ".t1"))),
        EntryPoint("tar", Dist("tar-two"), _formats(_named_format("tar2", ".t2"))),
    ]
    listed = [eps[i] for i in order]
    return PluginRegistry(entry_points=lambda: listed, autoload=True), eps


def _named_format(name: str, suffix: str) -> jio.Format:
    return type(name.title(), (jio.Format,), {"name": name, "suffixes": (suffix,)})()


@pytest.mark.parametrize("order", [[0, 1], [1, 0]], ids=["one-first", "two-first"])
def test_an_entry_point_name_of_two_distributions_fails_both_naming_each_other(
    order: list[int],
) -> None:
    """Two distributions advertising the entry point 'tar': neither loads, whatever the order
    of installation, and each warning names the other distribution and the rule."""
    registry, eps = _shared(order)
    with pytest.warns(PluginWarning) as caught:
        assert set(registry.formats) == {"directory", "zip"}
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2
    assert "'tar-one' failed" in messages[0] and "distribution 'tar-two'" in messages[0]
    assert "'tar-two' failed" in messages[1] and "distribution 'tar-one'" in messages[1]
    assert "unique among all installed distributions" in messages[0]
    assert [ep.loads for ep in eps] == [0, 0]


def test_blocking_one_distribution_by_name_lets_the_other_load() -> None:
    """The block list tells two entry points of one name apart by distribution name."""
    eps = [
        EntryPoint("tar", Dist("tar-one"), _formats(_named_format("tar1", ".t1"))),
        EntryPoint("tar", Dist("tar-two"), _formats(_named_format("tar2", ".t2"))),
    ]
    registry = PluginRegistry(entry_points=lambda: eps, autoload=True, block=["tar-one"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)
        assert "tar2" in registry.formats and "tar1" not in registry.formats
    states = {p.distribution: p.state for p in registry.plugins()}
    assert states["tar-one"] == "disabled" and states["tar-two"] == "loaded"


# -- where warnings point, and which processes see them ------------------------------------


def test_a_failed_plugin_warning_points_at_the_callers_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PluginWarning of a plugin that failed points at the user's export() line, not at
    jaxstruct's own modules."""
    ep = EntryPoint("bad", Dist("jaxstruct-bad"), error=ImportError("boom"))
    registry = PluginRegistry(entry_points=lambda: [ep], autoload=True)
    monkeypatch.setattr(jio._plugins, "_registry", registry)  # collected at first use
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        jio.export(VALUE, tmp_path / "c.zip")
    found = [w for w in caught if issubclass(w.category, PluginWarning)]
    assert [(Path(w.filename).name, w.lineno) for w in found] == [(Path(__file__).name, line)]


def _line() -> int:
    import inspect

    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def test_a_codec_type_clash_warns_nothing_where_the_type_is_not_used(tmp_path: Path) -> None:
    """Two plugins' codecs for one type: a process that never stores that type hears nothing
    of it; exporting a value of it raises, naming both distributions."""
    eps = [
        EntryPoint("a", Dist("dist-a"), _codecs(Codec("a.f", (fractions.Fraction,), str, str))),
        EntryPoint("b", Dist("dist-b"), _codecs(Codec("b.f", (fractions.Fraction,), str, str))),
    ]
    with PluginRegistry(entry_points=lambda: eps, autoload=True).using():
        with warnings.catch_warnings():
            warnings.simplefilter("error", PluginWarning)
            jio.load(jio.export(VALUE, tmp_path / "c.zip"))
        with pytest.raises(PluginError, match=r"Fraction.*'dist-a'.*'dist-b'"):
            jio.export({"f": fractions.Fraction(1, 2)}, tmp_path / "f.zip")
    assert not (tmp_path / "f.zip").exists()


# -- codecs whose decode does not give back their type --------------------------------------


def test_a_codec_decoding_to_another_type_is_refused_at_export(tmp_path: Path) -> None:
    """A codec whose decode returns str for a Fraction: export writes nothing and names the
    codec and its distribution (such a checkpoint could never load)."""
    bad = Codec("frac.bad", (fractions.Fraction,), lambda f: [f.numerator, f.denominator], str)
    ep = EntryPoint("frac", Dist("jaxstruct-frac"), _codecs(bad))
    with PluginRegistry(entry_points=lambda: [ep], autoload=True).using():
        with pytest.raises(
            SerializationError,
            match=r"codec 'frac.bad' \(plugin 'frac' from distribution 'jaxstruct-frac'\) "
            r"decodes .* as str, which is not one of its types \(Fraction\)",
        ):
            jio.export({"f": fractions.Fraction(1, 3)}, tmp_path / "f.zip")
    assert list(tmp_path.iterdir()) == []


def test_a_codec_is_checked_once_per_type_and_process(tmp_path: Path) -> None:
    """The decode check runs once per codec and type, not on every value."""
    calls = []

    def decode(pair: list[int]) -> fractions.Fraction:
        calls.append(pair)
        return fractions.Fraction(*pair)

    codec = Codec(
        "frac.counted", (fractions.Fraction,), lambda f: [f.numerator, f.denominator], decode
    )
    with jio.using(codec):
        values = [fractions.Fraction(i, 7) for i in range(1, 20)]
        jio.to_state_dict(values)
        jio.to_state_dict(values)
    assert len(calls) == 1


# -- the scoped registry ----------------------------------------------------------------------


def test_using_adds_a_format_for_the_block_only(tmp_path: Path) -> None:
    """A format used in a with block is exported and loaded there, and is gone after it."""
    with jio.using(_named_format("scoped-fmt", ".scoped")):
        assert "scoped-fmt" in jio.current_registry().formats
        assert jio.current_registry().suffixes[".scoped"].name == "scoped-fmt"
    assert "scoped-fmt" not in jio.current_registry().formats
    assert ".scoped" not in jio.current_registry().suffixes


def test_using_is_not_seen_by_other_threads() -> None:
    """Another thread running during the block sees the registry as it was."""
    seen: list[bool] = []
    codec = Codec("scoped.frac", (fractions.Fraction,), str, fractions.Fraction)
    with jio.using(codec):
        thread = threading.Thread(
            target=lambda: seen.append("scoped.frac" in jio.current_registry().codecs)
        )
        thread.start()
        thread.join()
        assert "scoped.frac" in jio.current_registry().codecs
    assert seen == [False]


def test_using_reaches_a_background_export(tmp_path: Path) -> None:
    """export(..., blocking=False) started in the block writes with the block's format."""
    from jaxstruct.io._builtin import ZipFormat

    class OtherZip(ZipFormat):
        name = "otherzip"
        suffixes = (".ozip",)

    with jio.using(OtherZip()):
        jio.export(VALUE, tmp_path / "c.ozip", blocking=False).wait(60)
        assert jio.inspect(tmp_path / "c.ozip").container == "otherzip"


def test_using_replaces_a_registered_format_of_the_same_name(tmp_path: Path) -> None:
    """An item named like an installed plugin's replaces it in the block (its suffixes too)."""
    from jaxstruct.io._builtin import ZipFormat

    class MyTar(ZipFormat):
        name = "tar"
        suffixes = (".tar",)

    mine = MyTar()
    with jio.using(mine):
        assert jio.current_registry().format_named("tar") is mine
        assert jio.current_registry().format_for_suffix(".tar") is mine
    assert jio.current_registry().format_named("tar") is not mine


def test_using_refuses_invalid_or_clashing_items() -> None:
    """An item a plugin could not register, or two items claiming one name, raise at once."""
    with pytest.raises(PluginError, match=r"using\(\) refused .*returned the class|class"):
        jio.using(Uxc)  # type: ignore[arg-type]
    with pytest.raises(PluginError, match=r"two items that claim the suffix '\.uxc'"):
        jio.using(Uxc(), _named_format("uxc2", ".uxc"))


def test_register_codec_inside_using_registers_in_the_process() -> None:
    """register_codec() within a block registers process-wide, as outside it."""

    class Celsius(float):
        pass

    codec = Codec("loud.celsius", (Celsius,), float, Celsius)
    with jio.using():
        jio.register_codec(codec)
        assert jio.current_registry().codec_for_type(Celsius) is codec
    assert jio.current_registry().codec_for_type(Celsius) is codec
