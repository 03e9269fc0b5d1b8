"""Misbehaving plugins installed as real distributions: each costs only itself (issue 26).

Every plugin of ``plugin_ecosystem`` is installed at once into one site
directory (a ``.dist-info`` per distribution), as real environments accumulate
them, and a fresh interpreter finds them through ``importlib.metadata``. One
scenario script runs every case in that one process (so the built-ins and the
other plugins are shown to keep working *in the same process* after each
failure) and reports each outcome as JSON; the tests below check them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import pytest

_spec = importlib.util.spec_from_file_location(
    "plugin_ecosystem", Path(__file__).parent / "fixtures" / "plugin_ecosystem.py"
)
assert _spec is not None and _spec.loader is not None
_ecosystem = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ecosystem)
install = _ecosystem.install

TIMEOUT = 240  # seconds: nothing may hang

SCRIPT = textwrap.dedent(
    """
    import datetime, fractions, json, os, sys, warnings
    from pathlib import Path
    import numpy as np

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import jaxstruct.io as jio
        jio.current_registry().formats
    out = {"warnings": [str(w.message) for w in caught]}
    tmp = Path(sys.argv[1])
    value = {"w": np.arange(3.0)}
    other = {"w": np.arange(5.0)}

    def attempt(name, fn):
        try:
            out[name] = {"ok": True, "value": fn()}
        except BaseException as err:
            cause = err.__cause__
            out[name] = {
                "ok": False,
                "type": type(err).__name__,
                "error": str(err),
                "cause": type(cause).__name__ if cause is not None else None,
            }

    def roundtrip(name, **kw):
        path = jio.export(value, tmp / name, **kw)
        return jio.load(path)["w"].tolist()

    def stored(name):
        return jio.load(tmp / name)["w"].tolist()

    attempt("register-fraction-first", lambda: jio.register_codec(
        jio.Codec("docs.fraction", (fractions.Fraction,), str, fractions.Fraction)))
    for name in ("d", "z.zip", "t.tar", "o.ownone", "o.owntwo", "g.greedy"):
        attempt(f"roundtrip {name}", lambda name=name: roundtrip(name))
    attempt("datetime", lambda: jio.load(
        jio.export({"t": datetime.date(2020, 1, 2)}, tmp / "dt.zip"))["t"].isoformat())
    import jsx_codecs_one as codecsone, jsx_codecs_two as codecstwo
    attempt("ok-one", lambda: jio.load(jio.export({"v": codecsone.OkOne(1)}, tmp / "1.zip"))["v"].v)
    attempt("ok-two", lambda: jio.load(jio.export({"v": codecstwo.OkTwo(2)}, tmp / "2.zip"))["v"].v)
    attempt("fraction-type", lambda: jio.export({"f": fractions.Fraction(1, 3)}, tmp / "f.zip"))
    payload = jio.to_state_dict({"s": codecsone.OkOne(5)})
    for node in payload["manifest"]["nodes"]:
        if node[0] == "codec":
            node[1] = "jsx.shared"
    attempt("shared-name-load", lambda: jio.from_state_dict(payload))
    attempt("dup-format", lambda: jio.export(value, tmp / "dup", format="jsx-dup"))
    attempt("h6-export", lambda: jio.export(value, tmp / "x.h6"))
    attempt("h6-explicit", lambda: roundtrip("y.h6", format="jsx-clash-one"))
    attempt("h5-export", lambda: jio.export(value, tmp / "x.h5"))
    attempt("h5-format", lambda: jio.export(value, tmp / "x", format="h5"))
    attempt("unknown-format", lambda: jio.export(value, tmp / "x", format="hdf5"))
    attempt("raising-write", lambda: jio.export(value, tmp / "x.rw"))
    attempt("raising-write-async",
            lambda: jio.export(value, tmp / "y.rw", blocking=False).wait(timeout=60))

    # A format contract broken on write: the previous checkpoint stays.
    for suffix in ("lazy", "wk"):
        attempt(f"{suffix}-good", lambda suffix=suffix: roundtrip(f"c.{suffix}"))
        os.environ["JSX_MISBEHAVE"] = "1"
        attempt(f"{suffix}-overwrite",
                lambda suffix=suffix: jio.export(other, tmp / f"c.{suffix}", overwrite=True))
        attempt(f"{suffix}-async", lambda suffix=suffix: jio.export(
            other, tmp / f"c.{suffix}", overwrite=True, blocking=False).wait(timeout=60))
        attempt(f"{suffix}-new", lambda suffix=suffix: jio.export(other, tmp / f"n.{suffix}"))
        os.environ["JSX_MISBEHAVE"] = "0"
        attempt(f"{suffix}-kept", lambda suffix=suffix: stored(f"c.{suffix}"))
        attempt(f"{suffix}-new-absent",
                lambda suffix=suffix: sorted(p.name for p in tmp.glob(f"*n.{suffix}*")))

    (tmp / "emptydir").mkdir()
    attempt("greedy-claims-a-stray-directory", lambda: jio.load(tmp / "emptydir"))
    for name in ("d", "z.zip", "t.tar", "o.ownone"):
        attempt(f"again {name}", lambda name=name: stored(name))
    attempt("plugins", lambda: [p.to_json() for p in jio.current_registry().plugins()])
    print(json.dumps(out))
    """
)


def _env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXSTRUCT_IO_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def outcome(site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("work")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(work)],
        env=_env(site),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _failed(outcome: dict[str, Any], name: str, kind: str, *words: str) -> str:
    result = outcome[name]
    assert not result["ok"], result
    assert result["type"] == kind, result
    for word in words:
        assert word in result["error"], (word, result["error"])
    return result["error"]


def test_the_plugins_are_found_through_importlib_metadata(outcome: dict[str, Any]) -> None:
    """Every distribution is seen; the good ones and the built-ins are loaded."""
    states = {p["distribution"]: p["state"] for p in outcome["plugins"]["value"]}
    assert states["jaxstruct-io"] == "loaded"
    assert states["jaxstruct-plugin-tar"] == "loaded"
    assert states["jaxstruct-plugin-datetime"] == "loaded"
    for dist in ("jsx-codecs-one", "jsx-formats-two", "jsx-greedy", "jsx-lazy"):
        assert states[dist] == "loaded", dist
    for dist in (
        "jsx-bad-import",
        "jsx-raising-hook",
        "jsx-class-not-instance",
        "jsx-bad-signature",
        "jsx-future-api",
    ):
        assert states[dist] == "failed", dist


@pytest.mark.parametrize(
    ("dist", "words"),
    [
        ("jsx-bad-import", ["'badimport'", "No module named 'h5py'"]),
        ("jsx-raising-hook", ["'raisinghook'", "RuntimeError: optional dependency missing"]),
        ("jsx-class-not-instance", ["'classplugin'", "returned the class H5", "return H5()"]),
        ("jsx-bad-signature", ["'badsig'", "does not fit its hook specification"]),
        ("jsx-future-api", ["'futureapi'", "JAXSTRUCT_IO_PLUGIN_API = 99", "upgrade"]),
    ],
)
def test_a_failed_plugin_is_one_warning_naming_it(
    outcome: dict[str, Any], dist: str, words: list[str]
) -> None:
    """A plugin that fails to import, raises, returns a class, misfits a hook: one warning."""
    found = [w for w in outcome["warnings"] if f"'{dist}'" in w]
    assert len(found) == 1, outcome["warnings"]
    assert "failed and is not used" in found[0]
    for word in words:
        assert word in found[0]


def test_builtins_and_good_plugins_keep_working(outcome: dict[str, Any]) -> None:
    """Directory, zip, the tar and datetime examples and good plugin formats round-trip."""
    for name in ("d", "z.zip", "t.tar", "o.ownone", "o.owntwo", "g.greedy"):
        assert outcome[f"roundtrip {name}"] == {"ok": True, "value": [0.0, 1.0, 2.0]}, name
    assert outcome["datetime"]["value"] == "2020-01-02"
    assert outcome["ok-one"]["value"] == 1 and outcome["ok-two"]["value"] == 2


def test_builtins_still_work_after_every_failure(outcome: dict[str, Any]) -> None:
    """After all the errors below, the same process still loads every checkpoint."""
    for name in ("d", "z.zip", "t.tar", "o.ownone"):
        assert outcome[f"again {name}"] == {"ok": True, "value": [0.0, 1.0, 2.0]}, name


def test_codec_type_clash_is_raised_where_the_type_is_exported(outcome: dict[str, Any]) -> None:
    """Two plugins' codecs for Fraction: exporting one names both distributions; collecting
    the plugins warns nothing about it (a process that never exports a Fraction)."""
    _failed(
        outcome,
        "fraction-type",
        "PluginError",
        "Fraction",
        "'jsx-codecs-one'",
        "'jsx-codecs-two'",
    )
    assert not [w for w in outcome["warnings"] if "codec type fractions.Fraction" in w]


def test_register_codec_before_first_io_fails_cleanly(outcome: dict[str, Any]) -> None:
    """io.md's register_codec for Fraction, before any I/O, is refused at once and breaks
    nothing later (the same outcome as after the first I/O call)."""
    _failed(outcome, "register-fraction-first", "PluginError", "Fraction", "'jsx-codecs-one'")


def test_codec_name_clash_is_raised_where_a_manifest_names_it(outcome: dict[str, Any]) -> None:
    """A manifest naming a codec two plugins register: the error names both."""
    _failed(
        outcome,
        "shared-name-load",
        "SerializationError",
        "codec name 'jsx.shared'",
        "'jsx-codecs-one'",
        "'jsx-codecs-two'",
        "root['s']",
    )


def test_format_name_clash_is_raised_where_format_names_it(outcome: dict[str, Any]) -> None:
    """Two plugins' formats named alike: format= that name names both distributions."""
    _failed(outcome, "dup-format", "PluginError", "'jsx-formats-one'", "'jsx-formats-two'")


def test_suffix_clash_is_raised_where_a_path_has_the_suffix(outcome: dict[str, Any]) -> None:
    """Two formats claiming .h6: exporting to it names both; format= one of them still works
    (and the file loads back, the manifest telling the two apart)."""
    _failed(
        outcome, "h6-export", "PluginError", "suffix '.h6'", "'jsx-formats-one'", "jsx-formats-two"
    )
    assert outcome["h6-explicit"] == {"ok": True, "value": [0.0, 1.0, 2.0]}


def test_names_of_a_failed_plugin_raise_its_error(outcome: dict[str, Any]) -> None:
    """A path with the suffix of a failed plugin's format, or format= its name: its error."""
    for name in ("h5-export", "h5-format"):
        _failed(outcome, name, "PluginError", "'classplugin'", "'jsx-class-not-instance'")


def test_an_unknown_format_names_the_failed_plugins(outcome: dict[str, Any]) -> None:
    """format= a name nobody registers: the failed plugins that may provide it are named."""
    _failed(outcome, "unknown-format", "SerializationError", "'badimport'", "'jsx-bad-import'")


def test_a_greedy_sniff_is_named_where_it_claims_a_path(outcome: dict[str, Any]) -> None:
    """A directory no built-in recognises goes to the greedy format, whose failure to open it
    is a SerializationError naming the format and its distribution (not its RuntimeError)."""
    _failed(
        outcome,
        "greedy-claims-a-stray-directory",
        "SerializationError",
        "'jsx-greedy-dir'",
        "'jsx-greedy'",
        "RuntimeError",
    )


def test_a_plugin_exception_in_write_is_wrapped(outcome: dict[str, Any]) -> None:
    """A plugin's own exception from write() is a SerializationError naming the format, with
    the exception chained, blocking or not."""
    for name in ("raising-write", "raising-write-async"):
        _failed(outcome, name, "SerializationError", "'jsx-raising-write'", "KeyError")
        assert outcome[name]["cause"] == "KeyError"


@pytest.mark.parametrize(
    ("suffix", "words"),
    [
        ("lazy", ["'jsx-lazy'", "without creating the checkpoint"]),
        ("wk", ["'jsx-wrong-kind'", "is_directory=False", "created a directory"]),
    ],
)
def test_a_write_breaking_the_contract_keeps_the_previous_checkpoint(
    outcome: dict[str, Any], suffix: str, words: list[str]
) -> None:
    """A write() that makes nothing, or a directory for a file format, is refused (blocking
    or not, new or overwrite) without hanging; the previous checkpoint still loads."""
    assert outcome[f"{suffix}-good"]["ok"]
    for case in ("overwrite", "async", "new"):
        _failed(outcome, f"{suffix}-{case}", "SerializationError", *words)
    assert outcome[f"{suffix}-kept"] == {"ok": True, "value": [0.0, 1.0, 2.0]}
    assert outcome[f"{suffix}-new-absent"] == {"ok": True, "value": []}


def test_block_and_allow_lists(site: Path) -> None:
    """Plugins blocked by entry-point or distribution name are listed as disabled and never
    imported; with an allow list only the listed ones load."""
    blocked = subprocess.run(
        [sys.executable, "-m", "jaxstruct.io._cli", "plugins", "--json"],
        env=_env(site, JAXSTRUCT_IO_BLOCK_PLUGINS="jsx-bad-import, raisinghook"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert blocked.returncode == 1  # other plugins still fail or clash
    states = {p["distribution"]: p for p in json.loads(blocked.stdout)}
    assert states["jsx-bad-import"]["state"] == "disabled"
    assert "JAXSTRUCT_IO_BLOCK_PLUGINS" in states["jsx-bad-import"]["reason"]
    assert states["jsx-raising-hook"]["state"] == "disabled"
    assert states["jsx-lazy"]["state"] == "loaded"
    allowed = subprocess.run(
        [sys.executable, "-m", "jaxstruct.io._cli", "plugins", "--json"],
        env=_env(site, JAXSTRUCT_IO_LOAD_PLUGINS="jsx_lazy,tar"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,  # exit status 0: the loaded ones work, the others are disabled
    )
    states = {p["distribution"]: p["state"] for p in json.loads(allowed.stdout)}
    assert states["jsx-lazy"] == "loaded" and states["jaxstruct-plugin-tar"] == "loaded"
    # (jaxstruct-safetensors: a plugin of ours installed in every run, the one without
    # jaxstruct-orbax too)
    assert states["jsx-bad-import"] == "disabled" and states["jaxstruct-safetensors"] == "disabled"
    assert states["jaxstruct-io"] == "loaded"


def test_plugins_command_lists_states_and_reasons(site: Path) -> None:
    """`jaxstruct plugins`: every plugin, distribution and version, registrations, state;
    exit status 1 when one failed or clashes."""
    done = subprocess.run(
        [sys.executable, "-m", "jaxstruct.io._cli", "plugins"],
        env=_env(site),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 1
    text = done.stdout
    assert "tar (jaxstruct-plugin-tar " in text and "formats: tar (.tar)" in text
    assert "badimport (jsx-bad-import 1.0): failed: importing it failed (ImportError" in text
    assert "codecsone (jsx-codecs-one 1.0): loaded" in text
    assert "problem: codec type fractions.Fraction is registered by both" in text
    # Failures are listed, not warned about; one line on stderr says which ones.
    assert done.stderr.startswith("jaxstruct plugins: not every plugin works: ")
    assert "'badimport' (jsx-bad-import)" in done.stderr and "Warning" not in done.stderr


def test_autoload_zero_leaves_autoloading_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a true-ish value of JAXSTRUCT_IO_DISABLE_PLUGIN_AUTOLOAD switches autoloading off."""
    for value, enabled in (("0", True), ("false", True), ("", True), ("1", False), ("yes", False)):
        monkeypatch.setenv(jio.AUTOLOAD_ENV, value)
        assert jio._plugins.autoload_enabled() is enabled, value
