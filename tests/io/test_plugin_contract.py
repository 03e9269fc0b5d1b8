"""Plugins in one process (issue 26): repeatable collection, recognisers, the write contract,
messages, tree paths. Installed-distribution cases are in test_plugin_ecosystem.py."""

from __future__ import annotations

import dataclasses
import fractions
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io import Codec, PluginError, PluginRegistry, PluginWarning, hookimpl
from jaxstruct.io._builtin import ZipFormat
from jaxstruct.io._formats import array_paths, walk
from jaxstruct.registry import SerializationError


@dataclasses.dataclass
class Dist:
    name: str
    version: str = "1.0"


@dataclasses.dataclass
class EntryPoint:
    name: str
    dist: Dist
    plugin: Any = None
    error: BaseException | None = None

    def load(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.plugin


def _formats_plugin(*formats: jio.Format) -> Any:
    return types.SimpleNamespace(jaxstruct_register_formats=hookimpl(lambda: list(formats)))


def _codecs_plugin(*codecs: Codec) -> Any:
    return types.SimpleNamespace(jaxstruct_register_codecs=hookimpl(lambda: list(codecs)))


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Callable[..., PluginRegistry]:
    """Make a registry of the given entry points the process-wide one, for this test."""

    def install(*eps: EntryPoint, **kw: Any) -> PluginRegistry:
        registry = PluginRegistry(entry_points=lambda: list(eps), autoload=True, **kw)
        monkeypatch.setattr(jio._plugins, "_registry", registry)
        return registry

    return install


FRACTION = Codec("docs.fraction", (fractions.Fraction,), str, fractions.Fraction)
VALUE = {"w": np.arange(3.0)}


# -- item 1: collecting is repeatable -----------------------------------------------


def test_register_codec_before_first_io_with_a_plugin_for_the_type(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """io.md's register_codec example, before any I/O, with a plugin for Fraction installed:
    refused at once naming the plugin (as after the first I/O call); every later load works."""
    other = Codec("plugin.fraction", (fractions.Fraction,), str, fractions.Fraction)
    use(EntryPoint("frac", Dist("dist-frac"), _codecs_plugin(other)))
    with pytest.raises(
        PluginError, match=r"both handle Fraction.*'dist-frac'|'dist-frac'.*Fraction"
    ):
        jio.register_codec(FRACTION)
    path = jio.export({"f": fractions.Fraction(1, 3), **VALUE}, tmp_path / "x.zip")
    assert jio.load(path)["f"] == fractions.Fraction(1, 3)
    with pytest.raises(PluginError, match="Fraction"):  # the same error again, not another one
        jio.register_codec(FRACTION)


def test_a_fixed_plugin_is_picked_up_by_reload(use: Callable[..., PluginRegistry]) -> None:
    """A plugin failing on import gives its true error; once fixed, reload() loads it."""
    ep = EntryPoint("frac", Dist("dist-frac"), error=ImportError("no module named 'sympy'"))
    registry = use(ep)
    with pytest.warns(PluginWarning, match="sympy"):
        assert registry.codec_named("docs.fraction") is None
    assert registry.codec_named("docs.fraction") is None  # no second warning, same state
    ep.error, ep.plugin = None, _codecs_plugin(FRACTION)
    registry.reload()
    assert registry.codec_named("docs.fraction") is FRACTION
    assert {p.name: p.state for p in registry.plugins()}["frac"] == "loaded"


def test_block_list_by_distribution_name_skips_the_import(
    use: Callable[..., PluginRegistry],
) -> None:
    """A blocked plugin is never imported and is listed as disabled."""
    ep = EntryPoint("frac", Dist("Dist_Frac"), error=AssertionError("must not be imported"))
    registry = use(ep, block=["dist-frac"])
    assert {p.name: p.state for p in registry.plugins()}["frac"] == "disabled"


# -- item 4: recognisers ----------------------------------------------------------------


class NpzLike(ZipFormat):
    """A zip-based plugin format (its files start with the zip signature)."""

    name = "npzlike"
    suffixes = (".npzlike",)


class Greedy(jio.Format):
    name = "greedy"
    is_directory = True

    def sniff(self, path: Any) -> bool:
        return True

    def open(self, path: Any, limits: jio.Limits) -> jio.OpenedCheckpoint:
        raise SerializationError("greedy cannot read this")


def test_a_zip_based_plugin_format_loads_its_own_files(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """The built-in zip sniff does not take a file whose suffix another format claims, and a
    file without that suffix is given to the format its manifest names."""
    use(EntryPoint("npz", Dist("dist-npz"), _formats_plugin(NpzLike())))
    path = jio.export(VALUE, tmp_path / "x.npzlike")
    assert jio.inspect(path).container == "npzlike"
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])
    renamed = path.rename(tmp_path / "renamed")
    assert jio.inspect(renamed).container == "npzlike"
    np.testing.assert_array_equal(jio.load(renamed)["w"], VALUE["w"])


def test_a_greedy_sniff_does_not_take_builtin_checkpoints(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """A plugin whose sniff claims every directory does not capture directory checkpoints."""
    use(EntryPoint("greedy", Dist("dist-greedy"), _formats_plugin(Greedy())))
    path = jio.export(VALUE, tmp_path / "ck")
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])


def test_ambiguous_recognisers_are_an_error_naming_the_candidates(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """Two plugin formats recognising one unclaimed path that neither can open: an error naming
    both, not whichever came first."""

    class GreedyTwo(Greedy):
        name = "greedy-two"

    use(
        EntryPoint("g1", Dist("dist-g1"), _formats_plugin(Greedy())),
        EntryPoint("g2", Dist("dist-g2"), _formats_plugin(GreedyTwo())),
    )
    (tmp_path / "odd").mkdir()
    with pytest.raises(PluginError, match=r"'greedy' \(dist-g1\).*'greedy-two' \(dist-g2\)"):
        jio.load(tmp_path / "odd")


# -- items 3 and 5: clashes and codecs that would never run -----------------------------


def test_register_format_with_a_taken_suffix_is_refused(use: Callable[..., PluginRegistry]) -> None:
    """A suffix already claimed is refused, naming who holds it."""
    use()

    class Other(ZipFormat):
        name = "other-zip"
        suffixes = (".zip",)

    with pytest.raises(PluginError, match=r"suffix '\.zip' is registered by both"):
        jio.register_format(Other())


@pytest.mark.parametrize("cls", [str, int, dict, np.ndarray, np.float32, tuple])
def test_register_codec_for_a_natively_stored_type_is_refused(
    use: Callable[..., PluginRegistry], cls: type
) -> None:
    """A codec for a type the manifest stores natively would never run: refused."""
    use()
    with pytest.raises(PluginError, match=r"stored natively.*never run"):
        jio.register_codec(Codec("t.native", (cls,), lambda v: v, lambda v: v))


# -- items 6 to 8: the write contract (blocking=False too) ----------------------------------


class Lazy(ZipFormat):
    name = "lazy"
    suffixes = (".lazy",)
    misbehave = False

    def write(self, target: Any, manifest: bytes, arrays: Any, **kw: Any) -> None:
        if not self.misbehave:
            super().write(target, manifest, arrays, **kw)


def test_a_write_creating_nothing_fails_in_the_background_too(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """blocking=False: the handle finishes with a SerializationError naming the format."""
    fmt = Lazy()
    use(EntryPoint("lazy", Dist("dist-lazy"), _formats_plugin(fmt)))
    path = jio.export(VALUE, tmp_path / "c.lazy")
    fmt.misbehave = True
    handle = jio.export({"w": np.zeros(1)}, path, overwrite=True, blocking=False)
    with pytest.raises(
        SerializationError,
        match=r"'lazy' format \(plugin 'lazy' from distribution 'dist-lazy'\).*without creating",
    ):
        handle.wait(timeout=60)
    assert handle.done()
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])


def test_wait_wraps_a_plugin_exception(use: Callable[..., PluginRegistry], tmp_path: Path) -> None:
    """ExportHandle.wait raises SerializationError with the plugin's exception chained."""

    class Raising(ZipFormat):
        name = "raising"
        suffixes = (".raising",)

        def write(self, *args: Any, **kw: Any) -> None:
            raise ZeroDivisionError("plugin bug")

    use(EntryPoint("r", Dist("dist-r"), _formats_plugin(Raising())))
    handle = jio.export(VALUE, tmp_path / "x.raising", blocking=False)
    with pytest.raises(SerializationError, match=r"'raising'.*ZeroDivisionError") as info:
        handle.wait(timeout=60)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_a_sniff_not_recognising_its_own_write_is_refused(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """The library checks, cheaply, that the format recognises what it wrote."""

    class Blind(ZipFormat):
        name = "blind"
        suffixes = (".blind",)

        def sniff(self, path: Any) -> bool:
            return False

    use(EntryPoint("b", Dist("dist-b"), _formats_plugin(Blind())))
    with pytest.raises(SerializationError, match="does not recognise"):
        jio.export(VALUE, tmp_path / "x.blind")
    assert list(tmp_path.iterdir()) == []


# -- items 14 to 17: messages -------------------------------------------------------


def test_inspect_shows_a_typed_prng_key(tmp_path: Path) -> None:
    """inspect (and --verify) of a checkpoint holding a typed PRNG key works."""
    from jaxstruct.io._cli import main

    path = jio.export({"key": jax.random.key(0)}, tmp_path / "k.zip")
    assert "PRNG key array (threefry2x32)" in jio.inspect(path).tree
    assert main(["inspect", str(path), "--verify"]) == 0


def test_load_errors_name_dict_keys_and_the_failing_codec(
    use: Callable[..., PluginRegistry],
) -> None:
    """Load-side paths read root['cfg']['lr'] as export's do, and name the codec that failed
    and who registered it."""
    use()
    good = Codec("t.bad", (fractions.Fraction,), str, fractions.Fraction)
    with jio.using(good):  # (export refuses a codec that cannot decode what it encodes)
        payload = jio.to_state_dict({"cfg": {"lr": fractions.Fraction(1, 3)}})
    bad = Codec("t.bad", (fractions.Fraction,), str, lambda s: 1 / 0)
    with (
        jio.using(bad),
        pytest.raises(
            SerializationError,
            match=r"root\['cfg'\]\['lr'\]: codec 't.bad' \('jaxstruct.io using\(\) in .*'\) "
            "failed to decode",
        ),
    ):
        jio.from_state_dict(payload)


def test_export_to_an_unclaimed_file_suffix_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A well-known file suffix nobody claims is refused (no directory named y.h5), naming it
    and saying when autoloading is off; format="directory" still writes one on purpose."""
    registry = PluginRegistry(entry_points=list, autoload=False)
    monkeypatch.setattr(jio._plugins, "_registry", registry)
    with pytest.raises(
        SerializationError, match=r"suffix '\.h5'.*autoloading is switched off.*format="
    ):
        jio.export(VALUE, tmp_path / "y.h5")
    assert not (tmp_path / "y.h5").exists()
    path = jio.export(VALUE, tmp_path / "y.h5", format="directory")
    assert path.is_dir()
    other = jio.export(VALUE, tmp_path / "run.v2")  # not a file suffix: a directory
    assert other.is_dir()


def test_load_of_an_unclaimed_suffix_names_it(tmp_path: Path) -> None:
    """load("x.h5") with no plugin for .h5 names the suffix nobody claims."""
    (tmp_path / "x.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64))
    with pytest.raises(SerializationError, match=r"no registered format claims the suffix '\.h5'"):
        jio.load(tmp_path / "x.h5")


def test_inspect_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`jaxstruct inspect ... | head` ends without a BrokenPipeError traceback."""
    path = jio.export({"a": [np.zeros(1)] * 2000}, tmp_path / "big.zip")
    with subprocess.Popen(
        [sys.executable, "-m", "jaxstruct.io._cli", "inspect", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 0
    assert "BrokenPipeError" not in stderr and "Traceback" not in stderr


# -- items 9 and 13: tree paths and the interface version -----------------------------------


def test_array_paths_name_arrays_by_tree_path_with_escaping() -> None:
    """Each array key maps to its tree path; dots and slashes in keys are escaped."""
    state = jio.to_state_dict(
        {
            "params": {"layers": [{"w": np.ones(1)}, {"w": np.ones(2)}]},
            "a.b/c": np.ones(3),
            1: np.ones(4),
            "1": np.ones(5),
            "key": jax.random.key(1),
        }
    )
    paths = array_paths(state)
    assert list(paths.values()) == [
        "params.layers.0.w",
        "params.layers.1.w",
        "a%2Eb%2Fc",
        "1",
        "1~a4",
        "key",
    ]
    assert set(paths) == set(state["arrays"])
    assert [n.path for n in walk(state)][:2] == ["", "params"]


def test_array_paths_are_the_same_on_read(tmp_path: Path) -> None:
    """A format gets the same paths back from the manifest bytes it stored."""
    from jaxstruct.io._encode import dump_manifest, encode_state
    from jaxstruct.io._load import open_checkpoint

    value = {"opt": {"mu": np.ones(2)}, "w": np.zeros(3)}
    written = array_paths(dump_manifest(encode_state(value), "zip"))
    path = jio.export(value, tmp_path / "p.zip")
    _, opened, _ = open_checkpoint(path, jio.Limits())
    try:
        assert array_paths(opened.manifest) == written == {"a0": "opt.mu", "a1": "w"}
    finally:
        opened.close()


def test_a_plugin_declaring_a_newer_interface_is_failed(
    use: Callable[..., PluginRegistry],
) -> None:
    """A plugin may declare the interface version it needs; a newer one fails with a message."""
    module = types.ModuleType("future_plugin")
    module.JAXSTRUCT_IO_PLUGIN_API = jio.PLUGIN_API_VERSION + 1  # type: ignore[attr-defined]
    registry = use(EntryPoint("future", Dist("dist-future"), module))
    with pytest.warns(PluginWarning, match=r"'dist-future'.*upgrade jaxstruct-io"):
        registry.formats
    current = types.ModuleType("current_plugin")
    current.JAXSTRUCT_IO_PLUGIN_API = jio.PLUGIN_API_VERSION  # type: ignore[attr-defined]
    registry = use(EntryPoint("current", Dist("dist-current"), current))
    assert {p.name: p.state for p in registry.plugins()}["current"] == "loaded"


# -- item 12: select= reads codec arrays only inside the selection ---------------------------


class Sparse:
    def __init__(self, data: np.ndarray) -> None:
        self.total = float(data.sum())  # needs real values: abstract arrays fail here
        self.data = data


class Recording(ZipFormat):
    """The zip format, recording which keys each read asks for."""

    name = "recording"
    suffixes = (".rec",)
    reads: list[list[str]] = []

    def open(self, path: Any, limits: jio.Limits) -> Any:
        opened = super().open(path, limits)
        read = opened.read_arrays

        def recorded(table: Any, wanted: Any) -> Any:
            Recording.reads.append(sorted(wanted))
            return read(table, wanted)

        opened.read_arrays = recorded  # type: ignore[method-assign]
        return opened


def test_select_reads_codec_arrays_only_inside_the_selection(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """A codec value holding arrays elsewhere in the checkpoint is not read by select=."""
    use(EntryPoint("rec", Dist("dist-rec"), _formats_plugin(Recording())))
    jio.register_codec(
        Codec("t.sparse", (Sparse,), lambda s: {"data": s.data}, lambda d: Sparse(d["data"]))
    )
    path = jio.export({"s": Sparse(np.arange(4.0)), "b": {"w": np.ones(2)}}, tmp_path / "c.rec")
    Recording.reads.clear()
    out = jio.load(path, select=lambda v: v["b"])
    np.testing.assert_array_equal(out["w"], np.ones(2))
    assert Recording.reads == [["a1"]]
    Recording.reads.clear()
    picked = jio.load(path, select=lambda v: v["s"])
    assert isinstance(picked, Sparse) and picked.total == 6.0
    assert Recording.reads == [["a0"]]


# -- item 10: the read contract, helped ---------------------------------------------------


def test_empty_array_is_aligned_in_either_order() -> None:
    """empty_array gives the 64-byte aligned buffer read_arrays must return, C or Fortran."""
    for order, flag in (("C", "C_CONTIGUOUS"), ("F", "F_CONTIGUOUS")):
        for n in (1, 3, 5, 17):
            arr = jio.empty_array(jio.ArraySpec(np.dtype("<i2"), (n, 3), n * 6), order)
            assert arr.ctypes.data % 64 == 0 and arr.flags[flag] and arr.shape == (n, 3)


def test_tar_example_reads_into_aligned_buffers(tmp_path: Path) -> None:
    """The tar example returns 64-byte aligned host arrays (it used to give offsets of 16, 32
    and 48 bytes mod 64), Fortran order included."""
    from jaxstruct.io._load import open_checkpoint

    value = {f"a{i}": np.arange(i + 1, dtype=np.int8) for i in range(8)}
    value["f"] = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    path = jio.export(value, tmp_path / "x.tar")
    _, opened, top = open_checkpoint(path, jio.Limits())
    try:
        table = {
            k: jio.ArraySpec(np.dtype(v["dtype"]), tuple(v["shape"]), 0)
            for k, v in top["arrays"].items()
        }
        table = {
            k: s._replace(nbytes=int(np.prod(s.shape)) * s.dtype.itemsize) for k, s in table.items()
        }
        out = opened.read_arrays(table, dict.fromkeys(table))
    finally:
        opened.close()
    assert all(arr.ctypes.data % 64 == 0 for arr in out.values())
    assert jio.load(path)["f"].flags.f_contiguous


class _Plain(jio.OpenedCheckpoint):
    """An opened checkpoint with no checksums of its own (no verify method)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.manifest = inner.manifest
        self.arrays_checked = inner.arrays_checked  # every read of the zip checks its CRCs

    def read_arrays(self, table: Any, wanted: Any) -> dict[str, Any]:
        Unchecked.reads.append(sorted(wanted))
        return self.inner.read_arrays(table, wanted)

    def close(self) -> None:
        self.inner.close()


class Unstated(ZipFormat):
    """A zip-based format whose opened checkpoints state nothing and have no ``verify``."""

    name = "unstated"
    suffixes = (".unstated",)
    reads: list[list[str]] = []

    def open(self, path: Any, limits: jio.Limits) -> Any:
        return _Plain(super().open(path, limits))


class Unchecked(Unstated):
    """The same, saying it keeps no checksums of its own: jaxstruct keeps them."""

    name = "unchecked"
    suffixes = (".unchecked",)
    checks_arrays = False


def test_verify_checks_jaxstructs_checksums_of_a_plain_format_one_array_at_a_time(
    use: Callable[..., PluginRegistry], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--verify of a format keeping no checksums of its own reads every array singly and
    checks it against jaxstruct's CRC-32s: sound, exit 0; one flipped byte, exit 1."""
    from jaxstruct.io._cli import main

    use(EntryPoint("u", Dist("dist-u"), _formats_plugin(Unchecked())))
    path = jio.export({"a": np.ones(3), "b": np.zeros(2)}, tmp_path / "x.unchecked")
    Unstated.reads.clear()
    assert main(["inspect", str(path), "--verify"]) == 0
    assert "every member is sound" in capsys.readouterr().out
    assert Unstated.reads == [["a0"], ["a1"]]
    data = bytearray(path.read_bytes())
    data[data.index(np.ones(3).tobytes()) + 5] ^= 1
    path.write_bytes(bytes(data))
    assert main(["inspect", str(path), "--verify"]) == 1


def test_inspect_of_a_format_that_states_no_checksums_says_so(
    use: Callable[..., PluginRegistry], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin whose opened checkpoint sets no ``checksum_scheme`` is reported as not
    stating its checksums, in the report, its text and its JSON (and by --verify)."""
    import json

    from jaxstruct.io._cli import main

    use(EntryPoint("u", Dist("dist-u"), _formats_plugin(Unstated())))
    path = jio.export({"a": np.ones(3)}, tmp_path / "x.unstated")
    info = jio.inspect(path)
    assert info.checksums == "not stated by the format" and info.has_manifest
    assert "checksums: not stated by the format" in str(info).splitlines()[1]
    assert main(["inspect", str(path), "--json", "--verify"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checksums"] == "not stated by the format"
    assert report["verify"] == {"ok": True, "problems": [], "checksums": True}


def test_a_raising_sniff_costs_only_its_format(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """A plugin whose sniff raises takes no load away from the others; when nothing else
    recognises a path, its error is named."""

    class Raising(jio.Format):
        name = "raising-sniff"

        def sniff(self, path: Any) -> bool:
            raise RuntimeError("sniff bug")

    use(EntryPoint("rs", Dist("dist-rs"), _formats_plugin(Raising())))
    path = jio.export(VALUE, tmp_path / "ck.zip")
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])
    (tmp_path / "junk").write_bytes(b"nothing")
    with pytest.raises(
        SerializationError,
        match=r"'raising-sniff' \(plugin 'rs' from distribution 'dist-rs'\) raised RuntimeError",
    ):
        jio.load(tmp_path / "junk")


def test_a_directory_format_writing_a_file_is_refused(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """is_directory=True but write() makes a file: refused, the previous checkpoint kept."""
    from jaxstruct.io._builtin import DirectoryFormat

    class FileMaker(DirectoryFormat):
        name = "filemaker"
        suffixes = (".fm",)
        misbehave = False

        def write(self, target: Any, manifest: bytes, arrays: Any, **kw: Any) -> None:
            if not self.misbehave:
                super().write(target, manifest, arrays, **kw)
            else:
                Path(target).write_bytes(manifest)

    fmt = FileMaker()
    use(EntryPoint("fm", Dist("dist-fm"), _formats_plugin(fmt)))
    path = jio.export(VALUE, tmp_path / "c.fm")
    fmt.misbehave = True
    with pytest.raises(SerializationError, match=r"is_directory=True.*created a file"):
        jio.export({"w": np.zeros(1)}, path, overwrite=True)
    assert path.is_dir()
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.fm"]


class _Reading(jio.Format):
    """A file format whose read_arrays() misbehaves as ``mode`` says."""

    name = "t-reading"
    suffixes = (".treading",)
    is_directory = False

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def write(self, target: Any, manifest: bytes, arrays: Any, **_: Any) -> None:
        held = {k: np.asarray(v) for k, v in arrays.items()}
        _Reading.stored[str(target)] = (manifest, held)
        Path(target).write_bytes(b"TREAD")

    def sniff(self, path: Any) -> bool:
        return Path(path).read_bytes()[:5] == b"TREAD"

    def open(self, path: Any, limits: Any) -> jio.OpenedCheckpoint:
        manifest, held = next(iter(_Reading.stored.values()))
        mode = self.mode

        class Opened(jio.OpenedCheckpoint):
            def read_arrays(self, table: Any, wanted: Any) -> Any:
                out = {k: held[k] for k in wanted}
                if mode == "shape":
                    return {k: v.reshape(-1)[:1] for k, v in out.items()}
                if mode == "dtype":
                    return {k: v.astype(np.float16) for k, v in out.items()}
                if mode == "missing":
                    return {}
                if mode == "list":
                    return list(out.values())
                if mode == "raise":
                    raise RuntimeError("read gremlin")
                return out

        opened = Opened()
        opened.manifest = manifest
        return opened

    stored: dict[str, Any] = {}


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("shape", r"read array 'a0' as float64 \(1,\), but the checkpoint stores float64 \(2, 3\)"),
        ("dtype", r"read array 'a0' as float16 \(2, 3\)"),
        ("missing", r"read array 'a0' as nothing"),
        ("list", r"returned list from read_arrays\(\)"),
        ("raise", r"failed in read_arrays\(\) \(RuntimeError: read gremlin\)"),
    ],
)
def test_a_formats_wrong_read_is_our_error_never_wrong_data(
    tmp_path: Path, use: Callable[..., PluginRegistry], mode: str, says: str
) -> None:
    """What a plugin format's read_arrays() gives is checked against the manifest: a wrong
    shape, dtype, a missing array or its own exception is a SerializationError naming it."""
    fmt = _Reading("ok")
    use(EntryPoint("reading", Dist("dist-reading"), _formats_plugin(fmt)))
    _Reading.stored.clear()
    path = jio.export({"w": np.arange(6.0).reshape(2, 3)}, tmp_path / "a.treading")
    fmt.mode = mode  # it read right when export checked what it wrote
    with pytest.raises(SerializationError, match=says) as info:
        jio.load(path)
    assert "'t-reading' format" in str(info.value) and "dist-reading" in str(info.value)


def test_a_formats_right_read_loads(tmp_path: Path, use: Callable[..., PluginRegistry]) -> None:
    use(EntryPoint("reading", Dist("dist-reading"), _formats_plugin(_Reading("ok"))))
    _Reading.stored.clear()
    path = jio.export({"w": np.arange(6.0).reshape(2, 3)}, tmp_path / "a.treading")
    np.testing.assert_array_equal(jio.load(path)["w"], np.arange(6.0).reshape(2, 3))


# -- issue 36: what a checkpoint's name may not change, and what a format's write must make --


class RootManifest(jio.Format):
    """A directory format keeping ``manifest.json`` at its root (beside ``<key>.npy`` files)."""

    name = "rootmanifest"
    suffixes = (".rootmanifest",)
    is_directory = True
    drop_arrays = False

    def write(self, target: Any, manifest: bytes, arrays: Any, **_: Any) -> None:
        target.mkdir()
        (target / "manifest.json").write_bytes(manifest)
        (target / "ROOTMANIFEST").write_bytes(b"")
        if not self.drop_arrays:
            for key, arr in arrays.items():
                np.save(target / f"{key}.npy", jio.host_array(arr))

    def sniff(self, path: Any) -> bool:
        return (Path(path) / "ROOTMANIFEST").exists()

    def open(self, path: Any, limits: jio.Limits) -> jio.OpenedCheckpoint:
        return _RootOpened(Path(path))


class _RootOpened(jio.OpenedCheckpoint):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.manifest = (path / "manifest.json").read_bytes()

    def check_members(self, table: Any) -> None:
        held = {p.stem for p in self.path.glob("*.npy")}
        if held != set(table):
            raise SerializationError(f"holds {sorted(held)}, not {sorted(table)}")

    def read_arrays(self, table: Any, wanted: Any) -> dict[str, Any]:
        return {k: np.load(self.path / f"{k}.npy", allow_pickle=False) for k in wanted}


def test_a_directory_checkpoint_named_like_a_file_format_loads(tmp_path: Path) -> None:
    """A directory checkpoint named run.tar (the tar plugin claims .tar, for files) loads by
    detection, without format=."""
    assert "tar" in jio.current_registry().formats  # the example plugin is installed
    path = jio.export(VALUE, tmp_path / "run.tar", format="directory")
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])
    assert jio.inspect(path).container == "directory"


def test_a_plugin_directory_with_its_manifest_at_the_root_loads_without_its_suffix(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """The built-in directory format recognises manifest.json but cannot open this one: the
    plugin format that recognises it reads it, whatever the checkpoint's name."""
    use(EntryPoint("root", Dist("dist-root"), _formats_plugin(RootManifest())))
    path = jio.export(VALUE, tmp_path / "ck.rootmanifest")
    renamed = path.rename(tmp_path / "ck")
    np.testing.assert_array_equal(jio.load(renamed)["w"], VALUE["w"])
    assert jio.inspect(renamed).container == "rootmanifest"


class Dropping(ZipFormat):
    """A zip-based format whose write leaves out the arrays (or changes the manifest) when
    told to, and still recognises what it wrote."""

    name = "dropping"
    suffixes = (".dropping",)
    mode = ""

    def write(self, target: Any, manifest: bytes, arrays: Any, **kw: Any) -> None:
        if self.mode == "arrays":
            arrays = {}
        elif self.mode == "manifest":
            manifest = manifest.replace(b'"w"', b'"v"')
        super().write(target, manifest, arrays, **kw)


@pytest.mark.parametrize(
    ("mode", "says"),
    [("arrays", r"does not hold the arrays given"), ("manifest", r"manifest is not the one given")],
)
def test_a_write_that_loses_what_it_was_given_keeps_the_previous_checkpoint(
    use: Callable[..., PluginRegistry], tmp_path: Path, mode: str, says: str
) -> None:
    """overwrite=True with a format whose write leaves out the arrays (or writes another
    manifest) but passes its own sniff: refused, naming the plugin and its distribution,
    and the previous checkpoint still loads."""
    fmt = Dropping()
    use(EntryPoint("drop", Dist("dist-drop"), _formats_plugin(fmt)))
    path = jio.export(VALUE, tmp_path / "c.dropping")
    fmt.mode = mode
    with pytest.raises(SerializationError, match=says) as info:
        jio.export({"w": np.zeros(2)}, path, overwrite=True)
    assert "plugin 'drop' from distribution 'dist-drop'" in str(info.value)
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.dropping"]


def test_a_directory_plugin_losing_its_arrays_keeps_the_previous_checkpoint(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """The same for a directory format of a plugin, through its check_members()."""
    fmt = RootManifest()
    use(EntryPoint("root", Dist("dist-root"), _formats_plugin(fmt)))
    path = jio.export(VALUE, tmp_path / "c.rootmanifest")
    fmt.drop_arrays = True
    with pytest.raises(SerializationError, match=r"'rootmanifest'.*does not hold the arrays"):
        jio.export(VALUE, path, overwrite=True)
    np.testing.assert_array_equal(jio.load(path)["w"], VALUE["w"])


class Careless(jio.Format):
    """A directory format whose write fsyncs nothing (nested files and a subdirectory)."""

    name = "careless"
    suffixes = (".careless",)
    is_directory = True

    def write(self, target: Any, manifest: bytes, arrays: Any, **_: Any) -> None:
        (target / "arrays").mkdir(parents=True)
        (target / "manifest.json").write_bytes(manifest)
        (target / "CARELESS").write_bytes(b"")
        for key, arr in arrays.items():
            np.save(target / "arrays" / f"{key}.npy", jio.host_array(arr))

    def sniff(self, path: Any) -> bool:
        return (Path(path) / "CARELESS").exists()


def test_what_a_plugin_wrote_is_fsynced_before_it_is_published(
    use: Callable[..., PluginRegistry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file and directory a plugin format created is fsynced (on the worker threads
    too) before export renames it into place, and the parent after."""
    import os

    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    use(EntryPoint("careless", Dist("dist-careless"), _formats_plugin(Careless())))
    monkeypatch.setattr(os, "fsync", spy)
    path = jio.export({"w": np.ones(2), "b": np.zeros(3)}, tmp_path / "c.careless")
    # Synced under the temporary name, before the rename: paths relative to that directory.
    temp = [s.split(".jaxstruct-tmp-", 1)[1] for s in synced if ".jaxstruct-tmp-" in s]
    seen = {rel.partition("/")[2] for rel in temp}
    made = {str(p.relative_to(path)) for p in path.rglob("*")} | {""}
    assert made <= seen, made - seen
    assert str(tmp_path) in synced  # the parent, after the rename


class Remote(jio.Format):
    """A format of URLs (``fake://NAME``), kept in memory."""

    name = "fake-remote"
    remote_paths = True
    publishes_atomically = True
    stored: dict[str, tuple[bytes, dict[str, Any]]] = {}

    def write(self, target: Any, manifest: bytes, arrays: Any, **_: Any) -> None:
        Remote.stored[target] = (manifest, {k: np.asarray(v) for k, v in arrays.items()})

    def sniff(self, path: Any) -> bool:
        return isinstance(path, str) and path in Remote.stored

    def open(self, path: Any, limits: jio.Limits) -> jio.OpenedCheckpoint:
        manifest, held = Remote.stored[path]

        class Opened(jio.OpenedCheckpoint):
            def read_arrays(self, table: Any, wanted: Any) -> dict[str, Any]:
                return {k: held[k] for k in wanted}

        opened = Opened()
        opened.manifest = manifest
        return opened


def test_inspect_takes_the_urls_load_takes(use: Callable[..., PluginRegistry]) -> None:
    """inspect("fake://ck") describes what load("fake://ck") reads (it took the URL for a
    local path and found nothing)."""
    use(EntryPoint("remote", Dist("dist-remote"), _formats_plugin(Remote())))
    jio.export(VALUE, "fake://ck", format="fake-remote")
    np.testing.assert_array_equal(jio.load("fake://ck")["w"], VALUE["w"])
    info = jio.inspect("fake://ck")
    assert info.container == "fake-remote" and info.path == "fake://ck"


def test_a_directory_read_as_a_file_format_is_our_error(tmp_path: Path) -> None:
    """load(a directory, format="tar") is a SerializationError saying what is wrong (it was
    the tar plugin's IsADirectoryError)."""
    assert "tar" in jio.current_registry().formats  # the example plugin is installed
    path = jio.export(VALUE, tmp_path / "ck")
    with pytest.raises(SerializationError, match=r"is a directory, and the 'tar' format reads"):
        jio.load(path, format="tar")
    with pytest.raises(SerializationError, match=r"is a file, and the 'directory' format reads"):
        jio.load(jio.export(VALUE, tmp_path / "f.zip"), format="directory")


def test_a_declined_write_async_writes_once_in_the_background(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """A self-publishing format whose write_async returns None (it declines) is written once,
    by write() in the background, from private copies of the arrays."""

    class Declining(Remote):
        name = "declining"
        writes: list[str] = []

        def write(self, target: Any, manifest: bytes, arrays: Any, **kw: Any) -> None:
            Declining.writes.append(target)
            super().write(target, manifest, arrays, **kw)

        def write_async(self, *args: Any, **kw: Any) -> None:
            return None

    use(EntryPoint("declining", Dist("dist-declining"), _formats_plugin(Declining())))
    handle = jio.export(VALUE, "fake://declined", format="declining", blocking=False)
    handle.wait(timeout=60)
    assert Declining.writes == ["fake://declined"]
    np.testing.assert_array_equal(jio.load("fake://declined")["w"], VALUE["w"])


_OURS = "CRC-32 of every 1 MiB piece of every array and of the manifest, kept by jaxstruct"


@pytest.mark.parametrize(
    ("stated", "shown"),
    [
        ("xxHash-64 of every block", f"{_OURS}; the format's own: xxHash-64 of every block"),
        (3, _OURS),
    ],
)
def test_inspect_reports_the_checksums_a_plugin_states(
    stated: Any, shown: str, use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """A plugin's ``checksum_scheme`` is reported beside jaxstruct's own CRC-32s (kept for a
    format that keeps none); one that is not a string is not reported (no foreign value
    reaches the report)."""

    class Stating(Unchecked):
        name = "stating"
        suffixes = (".stating",)

        def open(self, path: Any, limits: jio.Limits) -> Any:
            opened = super().open(path, limits)
            opened.checksum_scheme = stated
            return opened

    use(EntryPoint("s", Dist("dist-s"), _formats_plugin(Stating())))
    path = jio.export({"a": np.ones(3)}, tmp_path / "x.stating")
    assert jio.inspect(path).checksums == shown
    assert jio.inspect(path).to_json()["checksums"] == shown


class _Listless(jio.OpenedCheckpoint):
    """A checkpoint without a manifest whose ``tensors()`` is malformed."""

    manifest = None

    def tensors(self) -> Any:
        return {"w": ("not a dtype", (2,), 8)}


class Listless(jio.Format):
    name = "listless"
    suffixes = (".listless",)

    def sniff(self, path: Any) -> bool:
        return Path(path).read_bytes() == b"listless"

    def open(self, path: Any, limits: jio.Limits) -> jio.OpenedCheckpoint:
        return _Listless()


def test_a_malformed_tensor_list_is_the_formats_bug_in_inspect_and_verify(
    use: Callable[..., PluginRegistry], tmp_path: Path
) -> None:
    """inspect and --verify of a manifest-less checkpoint whose format lists its tensors
    wrongly raise our error naming the format and its distribution, not a TypeError."""
    from jaxstruct.io._inspect import verify_report

    use(EntryPoint("l", Dist("dist-l"), _formats_plugin(Listless())))
    path = tmp_path / "x.listless"
    path.write_bytes(b"listless")
    for call in (jio.inspect, verify_report):
        with pytest.raises(SerializationError, match=r"'listless' format .*dist-l.*wrongly"):
            call(path)
