"""``FormatTests``: jaxstruct's own conformance tests for a format plugin, in one subclass.

A plugin's test suite subclasses it once per format::

    class TestTar(FormatTests):
        format = TarFormat()

and pytest runs every test below on that format, through jaxstruct's own ``export``,
``load`` and ``inspect``, with the format used for each test only
(:meth:`jaxstruct.io.PluginRegistry.using`): nothing is installed process-wide, so an
installed copy of the same plugin is replaced for the test, not tested. Each failure
names the promise the format breaks and what to change.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import jaxstruct.io as jio
import numpy as np

try:
    import pytest
except ModuleNotFoundError:  # pragma: no cover - every test run has it
    raise ModuleNotFoundError(
        "jaxstruct.testing.FormatTests and CodecTests are pytest test classes: install "
        "pytest (pip install pytest) in the environment that runs your plugin's tests"
    ) from None
from hypothesis import HealthCheck, given, settings
from jaxstruct.io import ArraySpec, Format, Limits, PluginError
from jaxstruct.registry import SerializationError, StructError

from ._kit_faults import FAULT_MESSAGE, faulty, in_child, kill_self, variant
from ._kit_values import (
    copy_checkpoint,
    damages,
    difference,
    dtype_samples,
    flip_inside,
    size_of,
    trees,
)

__all__ = ["FormatTests"]

#: The string the damage tests look for in a file to change one of its bytes.
PROBE = "jaxstruct-kit-manifest-probe"


def _fault_raising(error: BaseException) -> Callable[[], None]:
    def fault() -> None:
        raise error

    return fault


class FormatTests:
    """The promises of a ``jaxstruct.io`` format, as tests: subclass it and set ``format``.

    Example (in a plugin's ``tests/test_format.py``)::

        from jaxstruct.testing import FormatTests
        from my_plugin import H5Format

        class TestH5(FormatTests):
            format = H5Format()

    Every test runs ``export``, ``load`` and ``inspect`` with the format used for that
    test only (:meth:`jaxstruct.io.PluginRegistry.using`). They check: round trips of
    every dtype jaxstruct stores (bfloat16, float8, int4, bool, complex, strings, 0-d,
    empty, non-contiguous, large, Fortran order kept), sharded ``jax.Array`` values and
    loads into a target's shardings, ``select=``, ``blocking=False``; that an overwrite
    keeps the previous checkpoint when ``write`` fails and when the process is killed,
    that nothing is left beside the checkpoint, and that only checkpoints of this format
    are replaced; that ``sniff`` says no to other formats' files and to garbage, that
    ``open`` and ``read_arrays`` of cut, garbled or foreign files raise only jaxstruct's
    errors, that damaged data and manifests are found, that ``compression`` values are
    honoured or refused with a ``SerializationError``, that the limits are enforced, and
    that random trees (Hypothesis) round-trip exactly. The run needs pytest (and
    ``os.fork`` for the killed-export test, which is skipped without it).

    Attributes:
        format: the format instance under test (not registered anywhere).
        max_examples: how many random trees the property test draws (default 10).
    """

    format: ClassVar[Any] = None
    max_examples: ClassVar[int] = 10

    # -- machinery ------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _kit_use_the_format(self) -> Iterator[None]:
        fmt = self.format
        if not isinstance(fmt, Format):
            pytest.fail(
                f"{type(self).__name__}.format is {fmt!r}; set it to an instance of your "
                "jaxstruct.io.Format subclass (format = MyFormat())",
                pytrace=False,
            )
        try:
            scope = jio.using(fmt)
        except PluginError as err:
            pytest.fail(f"the format cannot be used as a plugin's would be: {err}", pytrace=False)
        with scope:
            yield

    def _name(self) -> str:
        return str(self.format.name)

    def _broken(self, promise: str, found: str, fix: str) -> AssertionError:
        return AssertionError(
            f"the {self._name()!r} format breaks a promise: {promise}.\n"
            f"  found: {found}\n  fix: {fix}"
        )

    def _path(self, root: Path, stem: str = "checkpoint") -> Path:
        suffixes = tuple(self.format.suffixes)
        return root / f"{stem}{suffixes[0] if suffixes else ''}"

    def _export(self, value: Any, path: Path, **kw: Any) -> Path:
        return jio.export(value, path, format=self._name(), **kw)

    def _load(self, path: Path, **kw: Any) -> Any:
        return jio.load(path, format=self._name(), **kw)

    def _round_trip(self, value: Any, root: Path, what: str, fix: str, **kw: Any) -> Any:
        back = self._exported_and_loaded(value, self._path(root), what, **kw)
        found = difference(value, back)
        if found is not None:
            raise self._broken(f"{what} come back exactly as exported", found, fix)
        return back

    def _exported_and_loaded(
        self, value: Any, path: Path, what: str, promise: str = "", **kw: Any
    ) -> Any:
        """``load(export(value))``; an error of either (export reads back and checks what
        the format wrote) names the promise it breaks."""
        try:
            return self._load(self._export(value, path, **kw))
        except (StructError, OSError) as err:
            raise self._broken(
                promise or f"{what} come back exactly as exported",
                f"{type(err).__name__}: {err}",
                "see the error: write() must store, and open()/read_arrays() give back, "
                "everything export handed it",
            ) from err

    def _beside(self, path: Path) -> list[str]:
        return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)

    def _table(self, manifest: bytes) -> dict[str, ArraySpec]:
        table = {}
        for key, spec in json.loads(manifest)["arrays"].items():
            dtype = _dtype(spec["dtype"])
            shape = tuple(spec["shape"])
            table[key] = ArraySpec(dtype, shape, math.prod(shape) * dtype.itemsize)
        return table

    # -- what a format is ------------------------------------------------------------------

    def test_is_a_format_a_plugin_could_register(self) -> None:
        """The format has a name and suffixes jaxstruct accepts from a plugin."""
        try:
            jio.using(self.format)
        except PluginError as err:  # pragma: no cover - the autouse fixture fails first
            raise self._broken(
                "a plugin's format has a unique name and suffixes starting with '.'",
                str(err),
                "set name and suffixes as the class attributes of jaxstruct.io.Format say",
            ) from None

    # -- round trips ------------------------------------------------------------------------

    def test_every_dtype_round_trips(self, tmp_path: Path) -> None:
        """Arrays of every dtype jaxstruct stores come back with their dtype and bits, and
        export leaves the caller's arrays as they were."""
        value = dtype_samples()
        before = {name: arr.tobytes() for name, arr in value.items()}
        promise = "arrays of every dtype jaxstruct stores come back with that dtype and bits"
        back = self._exported_and_loaded(value, self._path(tmp_path), "", promise)
        changed = [name for name, arr in value.items() if arr.tobytes() != before[name]]
        if changed:
            raise self._broken(
                "write() leaves the arrays it is given unchanged",
                f"the arrays of dtype {changed} changed during export",
                "never write into the arrays (copy before converting, or view them as uint8)",
            )
        wrong = {name: difference(arr, back.get(name), name) for name, arr in value.items()}
        wrong = {name: problem for name, problem in wrong.items() if problem}
        if wrong:
            raise self._broken(
                promise,
                "; ".join(wrong.values()),
                "store each array's raw bytes (arr.view(numpy.uint8) of a contiguous copy) and "
                "read them into empty_array(spec, order); never convert the dtype",
            )

    def test_memory_order_is_kept(self, tmp_path: Path) -> None:
        """An array in Fortran order comes back in Fortran order (io.md promises it)."""
        value = {
            "f2": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
            "f3": np.asfortranarray(np.arange(24, dtype=np.int16).reshape(2, 3, 4)),
            "c2": np.arange(6, dtype=np.float32).reshape(2, 3),
        }
        self._round_trip(
            value,
            tmp_path,
            "arrays in Fortran order",
            "store the memory order with each array ('C' or 'F') and allocate the read "
            "buffer with empty_array(spec, order)",
        )

    def test_zero_dimensional_empty_and_non_contiguous_arrays(self, tmp_path: Path) -> None:
        """0-d arrays, arrays with a zero-length axis, strided and reversed views and
        transposes that are neither C nor Fortran ordered round-trip."""
        base = np.arange(60.0).reshape(3, 4, 5)
        value = {
            "scalar": np.array(2.5),
            "scalar_bool": np.array(True),
            "empty": np.zeros((0,), np.float32),
            "empty_2d": np.zeros((3, 0), np.int64),
            "strided": base[:, ::2, 1::2],
            "reversed": base[::-1, :, ::-1],
            "transposed": base.transpose(1, 0, 2),
        }
        self._round_trip(
            value,
            tmp_path,
            "0-d, empty and non-contiguous arrays",
            "write np.ascontiguousarray(arr) (or arr.reshape(-1, order=order)) of each array, "
            "and handle shapes with a zero-length axis and 0-d shapes ()",
        )

    def test_a_large_array_round_trips(self, tmp_path: Path) -> None:
        """An array of several MiB, of an odd length, comes back exactly."""
        rng = np.random.default_rng(7)
        value = {"big": rng.standard_normal(3 * (1 << 18) + 5).astype(np.float32)}
        self._round_trip(
            value, tmp_path, "large arrays", "read and write arrays of any size in full"
        )

    def test_many_arrays_and_awkward_names_round_trip(self, tmp_path: Path) -> None:
        """Hundreds of arrays, and arrays under dict keys with dots, slashes, percent signs,
        empty strings, non-ASCII letters and long names, round-trip."""
        long = "k" * 120
        value: dict[Any, Any] = {f"a{i}": np.full(3, i, np.int16) for i in range(200)}
        value.update(
            {
                "": {"": np.arange(2), "a": np.arange(3)},
                "a.b": np.arange(4),
                "a/b": np.arange(5),
                "%2E": np.arange(6),
                "ünï✓": np.arange(7),
                long: {long: {long: np.arange(8)}},
                1: np.arange(9),
                "1": np.arange(10),
            }
        )
        self._round_trip(
            value,
            tmp_path,
            "arrays under any dict keys",
            "name stored arrays by their keys (a0, a1, ...) or by array_paths(); tree paths "
            "can be long and hold any character but '/' (a file named after one may need a "
            "shorter name)",
        )

    def test_jax_arrays_and_prng_keys_round_trip(self, tmp_path: Path) -> None:
        """jax.Array values (bfloat16 too) and typed PRNG keys come back as jax.Array values."""
        import jax
        import jax.numpy as jnp

        value = {
            "w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
            "h": jnp.ones(5, jnp.bfloat16),
            "key": jax.random.key(3),
        }
        self._round_trip(
            value,
            tmp_path,
            "jax.Array values and PRNG keys",
            "write jax.Array values through host_pieces(arr) (each shard once); PRNG keys "
            "arrive as uint32 key data",
        )

    def test_sharded_arrays_round_trip_and_load_into_target_shardings(self, tmp_path: Path) -> None:
        """Arrays sharded over every device along the first axis, an inner axis, two mesh
        axes, or replicated come back with their values; loaded into a target, each gets
        exactly the target's sharding."""
        import jax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        devices = np.array(jax.devices())
        n = len(devices)
        line = Mesh(devices, ("x",))
        value = {
            "rows": jax.device_put(
                np.arange(2 * n * n, dtype=np.float32).reshape(2 * n, n),
                NamedSharding(line, P("x")),
            ),
            "cols": jax.device_put(
                np.arange(n * 3 * n, dtype=np.int32).reshape(n, 3 * n),
                NamedSharding(line, P(None, "x")),
            ),
            "replicated": jax.device_put(
                np.arange(2.0 * n, dtype=np.float32), NamedSharding(line, P())
            ),
        }
        if n >= 4 and n % 2 == 0:
            grid = Mesh(devices.reshape(2, n // 2), ("a", "b"))
            value["grid"] = jax.device_put(
                np.arange(4 * n, dtype=np.float32).reshape(4, n), NamedSharding(grid, P("a", "b"))
            )
        path = self._path(tmp_path)
        back = self._exported_and_loaded(value, path, "sharded jax.Array values")
        found = difference(value, back)
        if found is not None:
            raise self._broken(
                "sharded jax.Array values come back exactly as exported",
                found,
                "write each distinct shard from host_pieces(arr) at its index (shards split "
                "inner axes too); never assume one shard holds the whole array",
            )
        flipped = {
            "rows": NamedSharding(line, P(None, "x")),
            "cols": NamedSharding(line, P("x")),
            "replicated": NamedSharding(line, P("x")),
        }
        flipped.update({"grid": value["grid"].sharding} if "grid" in value else {})
        target = {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=flipped[k]) for k, v in value.items()
        }
        try:
            placed = self._load(path, target=target)
        except (StructError, OSError) as err:
            raise self._broken(
                "arrays load into a target's shardings",
                f"{type(err).__name__}: {err}",
                "return place(host_array, placement) for a placement that is a sharding",
            ) from err
        for key, arr in placed.items():
            if not isinstance(arr, jax.Array) or not arr.sharding.is_equivalent_to(
                flipped[key], arr.ndim
            ):
                raise self._broken(
                    "read_arrays puts each array exactly where its placement says",
                    f"{key!r} came back as {type(arr).__name__} with sharding "
                    f"{getattr(arr, 'sharding', None)}, not {flipped[key]}",
                    "return place(host_array, placement) (or read each device's slice into "
                    "jax.make_array_from_callback) for a placement that is a sharding",
                )
            if not np.array_equal(np.asarray(arr), np.asarray(value[key])):
                raise self._broken(
                    "arrays loaded into a target's sharding hold the stored values",
                    f"{key!r} differs",
                    "read the slice each device needs from the stored array",
                )

    def test_select_reads_only_the_picked_arrays(self, tmp_path: Path) -> None:
        """load(select=...) gives the picked part, and read_arrays returns exactly the
        wanted keys (a partial restore never reads the others)."""
        value = {"small": np.arange(3.0), "other": np.ones((4, 4), np.float32), "n": 3}
        path = self._export(value, self._path(tmp_path))
        asked: list[tuple[set[str], set[str]]] = []
        fmt = self.format
        real_open = fmt.open

        def spying_open(where: Any, limits: Limits) -> Any:
            opened = real_open(where, limits)
            read = opened.read_arrays

            def read_arrays(table: Mapping[str, ArraySpec], wanted: Mapping[str, Any]) -> Any:
                got = read(table, wanted)
                asked.append((set(wanted), set(got)))
                return got

            opened.read_arrays = read_arrays
            return opened

        with jio.using(variant(fmt, open=spying_open)):
            picked = self._load(path, select=lambda tree: tree["small"])
        found = difference(value["small"], picked, "select(x)")
        if found is not None:
            raise self._broken(
                "load(select=...) gives the picked part", found, "read the wanted keys"
            )
        extra = [sorted(got - wanted) for wanted, got in asked if got != wanted]
        if extra:
            raise self._broken(
                "read_arrays(table, wanted) returns exactly the keys of wanted",
                f"it also returned {extra[0]}",
                "read only the keys in wanted; the table lists every array for checking",
            )

    def test_host_loads_are_aligned_arrays(self, tmp_path: Path) -> None:
        """Arrays loaded to host memory start at a 64-byte boundary (so devices can adopt
        them without a copy)."""
        value = {"a": np.arange(33, dtype=np.float32), "b": np.arange(7, dtype=np.int8)}
        back = self._load(self._export(value, self._path(tmp_path)))
        odd = {k: v.ctypes.data % 64 for k, v in back.items() if v.ctypes.data % 64}
        if odd:
            raise self._broken(
                "read_arrays gives host arrays whose buffers start at a 64-byte boundary",
                f"arrays {sorted(odd)} start {sorted(set(odd.values()))} bytes past one",
                "allocate each host array with jaxstruct.io.empty_array(spec, order) and read "
                "into it",
            )

    def test_non_blocking_export_round_trips(self, tmp_path: Path) -> None:
        """export(..., blocking=False) writes the same checkpoint once waited for."""
        value = {"w": np.arange(10.0), "s": "x"}
        handle = jio.export(value, self._path(tmp_path), format=self._name(), blocking=False)
        handle.wait(120)
        found = difference(value, self._load(handle.path))
        if found is not None:
            raise self._broken(
                "a non-blocking export writes what a blocking one does",
                found,
                "if write_async is defined, its handle's wait() must finish the same writing",
            )

    def test_loads_release_their_files(self, tmp_path: Path) -> None:
        """Loading closes every file the format opened (close() releases them): no file
        is left for the garbage collector to close."""
        import gc
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            # (export opens what it wrote, to check it, and closes it as a load does)
            value = {"a": np.arange(5.0), "b": np.ones(3, np.int8)}
            path = self._export(value, self._path(tmp_path))
            self._load(path)  # (the first load may start jaxstruct's worker threads)
            gc.collect()
            fds = _open_fds()
            for _ in range(8):
                self._load(path)
                self._load(path, select=lambda tree: tree["a"])
            gc.collect()
        unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        grown = None if fds is None else _open_fds() - fds  # type: ignore[operator]
        if unclosed or (grown is not None and grown >= 8):
            raise self._broken(
                "loads close the files the format opened",
                unclosed[0] if unclosed else f"{grown} more open files after 16 loads",
                "close every file and handle in OpenedCheckpoint.close() (jaxstruct calls it "
                "after each load), or open them in with blocks",
            )

    def test_random_trees_round_trip(self) -> None:
        """Random trees of arrays (dtypes, shapes, memory orders) and values in dicts, lists
        and tuples round-trip exactly (a Hypothesis property)."""
        import tempfile

        @settings(
            max_examples=self.max_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            database=None,
        )
        @given(trees())
        def round_trip(tree: Any) -> None:
            with tempfile.TemporaryDirectory(prefix="jaxstruct-kit-") as root:
                self._round_trip(
                    tree,
                    Path(root),
                    "random trees",
                    "see the first difference above (and the tree Hypothesis printed)",
                )

        round_trip()

    # -- finding the format ------------------------------------------------------------------

    def test_export_by_suffix_and_load_by_content(self, tmp_path: Path) -> None:
        """A path with the format's suffix selects it; a checkpoint of it loads without
        format=, whatever its name (load recognises it with sniff)."""
        value = {"w": np.arange(4.0)}
        if self.format.suffixes:
            path = jio.export(value, self._path(tmp_path, "by-suffix"))
            if jio.inspect(path).container != self._name():
                raise self._broken(
                    "a path ending in one of its suffixes selects the format",
                    f"{path.name} was written as {jio.inspect(path).container!r}",
                    "claim the suffix in suffixes (lower case, with the dot)",
                )
        renamed = self._export(value, tmp_path / "renamed.data")
        try:
            if not self.format.sniff(renamed):
                raise AssertionError("sniff() returned False")
            back = jio.load(renamed)
        except (AssertionError, SerializationError) as err:
            raise self._broken(
                "a checkpoint of the format loads without format=, whatever its name",
                f"{err}",
                "make sniff(path) recognise the format's checkpoints by their content (the "
                "first bytes of a file, a marker file in a directory), never by the name",
            ) from None
        found = difference(value, back)
        if found is not None:
            raise self._broken("a checkpoint found by sniff() loads exactly", found, "see above")

    def test_inspect_describes_the_checkpoint(self, tmp_path: Path) -> None:
        """inspect() names the format and lists the arrays; inspect --verify passes on a
        sound checkpoint."""
        from jaxstruct.io._cli import main

        path = self._export({"w": np.zeros((2, 3), np.float32), "n": 1}, self._path(tmp_path))
        info = jio.inspect(path)
        if info.container != self._name() or len(info.arrays) != 1:
            raise self._broken(
                "inspect() reads the manifest the format stored",
                f"container {info.container!r}, arrays {info.arrays}",
                "open() must give back the manifest bytes write() was given",
            )
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["inspect", "--verify", str(path)])
        if status != 0:
            raise self._broken(
                "`jaxstruct inspect --verify` passes on a checkpoint just written",
                f"exit status {status}: {err.getvalue().strip()}",
                "verify(table) returns [] (no message) for a sound checkpoint",
            )

    def test_sniff_says_no_to_other_formats_and_garbage(self, tmp_path: Path) -> None:
        """sniff() recognises its own checkpoints, and says False (never raises) for the
        built-in formats' checkpoints, empty and garbage files and directories."""
        own = self._export({"w": np.arange(3.0)}, self._path(tmp_path, "own"))
        others: dict[str, Path] = {}
        for name in ("directory", "zip"):
            if name != self._name() and name not in self.format.also_reads:
                others[f"a {name} checkpoint"] = jio.export(
                    {"w": np.arange(3.0)}, tmp_path / f"other-{name}", format=name
                )
        rng = np.random.default_rng(1)
        (tmp_path / "empty-file").write_bytes(b"")
        (tmp_path / "garbage-file").write_bytes(rng.integers(0, 256, 4096, np.uint8).tobytes())
        (tmp_path / "text-file").write_text('{"format": "jaxstruct"}\n')
        (tmp_path / "empty-dir").mkdir()
        (tmp_path / "garbage-dir").mkdir()
        (tmp_path / "garbage-dir" / "data.bin").write_bytes(b"\x00\x01not a checkpoint")
        for name in ("empty-file", "garbage-file", "text-file", "empty-dir", "garbage-dir"):
            others[f"the {name.replace('-', ' ')}"] = tmp_path / name
        if not self._sniffs(own, "its own checkpoint"):
            raise self._broken(
                "sniff() recognises the format's own checkpoints",
                "sniff() returned False on a checkpoint export just wrote",
                "recognise the checkpoint by its content",
            )
        wrong = [what for what, path in others.items() if self._sniffs(path, what)]
        if wrong:
            raise self._broken(
                "sniff() says no to what is not a checkpoint of this format",
                f"sniff() returned True for {', '.join(wrong)}",
                "check a mark only your format writes (a magic number, a header field, a file "
                "name and its content), not merely that the path exists or is a file",
            )

    def _sniffs(self, path: Path, what: str) -> bool:
        """``sniff(path)`` as jaxstruct asks it (an ``OSError`` says no)."""
        try:
            return bool(self.format.sniff(path))
        except OSError:
            return False
        except Exception as err:
            raise self._broken(
                "sniff() answers for any existing path without raising",
                f"on {what} it raised {type(err).__name__}: {err}",
                "return False for anything you cannot read as your format (catch your "
                "parser's errors)",
            ) from err

    # -- overwriting, failures and kills -------------------------------------------------------

    def test_overwrite_replaces_its_checkpoint_leaving_nothing_beside_it(
        self, tmp_path: Path
    ) -> None:
        """overwrite=True replaces a checkpoint of the format; after an export, new or
        overwriting, nothing but the checkpoint is left in its directory."""
        path = self._path(tmp_path)
        self._export({"v": "old", "w": np.arange(3.0)}, path)
        if self._beside(path):
            raise self._broken(
                "an export leaves nothing beside the checkpoint",
                f"left {self._beside(path)}",
                "write only inside the target path write() is given",
            )
        self._export({"v": "new", "w": np.arange(5.0)}, path, overwrite=True)
        back = self._load(path)
        if back["v"] != "new" or self._beside(path):
            raise self._broken(
                "overwrite=True replaces the format's own checkpoint, leaving nothing beside it",
                f"loaded {back['v']!r}, left {self._beside(path)}",
                "owns(path) returns True for your checkpoints (the default reads the manifest)",
            )

    def test_overwrite_never_replaces_what_is_not_its_checkpoint(self, tmp_path: Path) -> None:
        """overwrite=True refuses to replace garbage of the format's kind, or another
        format's checkpoint, and leaves it as it was."""
        path = self._path(tmp_path)
        rng = np.random.default_rng(2)
        if self.format.is_directory:
            path.mkdir()
            (path / "data.bin").write_bytes(rng.integers(0, 256, 512, np.uint8).tobytes())
            other_name = "directory"
        else:
            path.write_bytes(rng.integers(0, 256, 512, np.uint8).tobytes())
            other_name = "zip"
        victims = [("garbage", path)]
        if other_name != self._name() and other_name not in self.format.also_reads:
            other = jio.export(
                {"w": np.arange(2.0)}, self._path(tmp_path, "other"), format=other_name
            )
            victims.append((f"a {other_name} checkpoint", other))
        for what, victim in victims:
            before = {p.relative_to(victim.parent): p.read_bytes() for p in _files(victim)}
            try:
                self._export({"w": np.arange(3.0)}, victim, overwrite=True)
            except (StructError, OSError):
                pass
            else:
                raise self._broken(
                    "overwrite=True replaces only checkpoints of this format",
                    f"{what} at the path was replaced",
                    "owns(path) must return True only for your own checkpoints (drop an owns() "
                    "that says yes to anything; the default asks sniff and reads the manifest)",
                )
            after = {p.relative_to(victim.parent): p.read_bytes() for p in _files(victim)}
            if after != before:
                raise self._broken(
                    "a refused overwrite leaves the path as it was",
                    f"{what} changed",
                    "owns() and sniff() only read",
                )

    @pytest.mark.parametrize(
        "error",
        [OSError(errno.ENOSPC, FAULT_MESSAGE), RuntimeError(FAULT_MESSAGE)],
        ids=["disk-full", "bug"],
    )
    def test_a_failed_write_keeps_the_previous_checkpoint(
        self, tmp_path: Path, error: BaseException
    ) -> None:
        """When write() fails half-way (the disk full, or a bug), export raises, the
        previous checkpoint loads as it was and nothing is left beside it."""
        path = self._path(tmp_path)
        old = {"v": "old", "a": np.arange(3.0), "b": np.arange(4.0)}
        self._export(old, path)
        new = {"v": "new", "a": np.arange(5.0), "b": np.arange(6.0)}
        with jio.using(faulty(self.format, _fault_raising(error))):
            try:
                self._export(new, path, overwrite=True)
            except (StructError, OSError):
                pass
            else:
                raise self._broken(
                    "an error while write() reads the arrays fails the export",
                    "export returned although reading an array raised "
                    f"{type(error).__name__}: {error}",
                    "let exceptions from reading the arrays propagate out of write()",
                )
        found = difference(old, self._load(path))
        if found is not None or self._beside(path):
            raise self._broken(
                "a failed export keeps the previous checkpoint and leaves nothing beside it",
                found or f"left {self._beside(path)}",
                "write only inside the target path write() is given (jaxstruct removes it "
                "when write() fails)",
            )

    @pytest.mark.parametrize("when", ["mid-write", "after-write"])
    def test_a_killed_export_keeps_the_previous_checkpoint(self, tmp_path: Path, when: str) -> None:
        """A process killed while write() runs, or just after it returns, leaves the previous
        checkpoint loadable; the next export to the path succeeds and clears what was left."""
        if not hasattr(os, "fork") or os.name != "posix":
            pytest.skip("needs os.fork() to kill an export in a child process")
        path = self._path(tmp_path)
        old = {"v": "old", "a": np.arange(3.0), "b": np.arange(4.0)}
        self._export(old, path)
        dying = faulty(self.format, kill_self, after=when == "after-write")
        new = {"v": "new", "a": np.arange(5.0), "b": np.arange(6.0)}

        def work() -> None:
            with jio.using(dying):
                self._export(new, path, overwrite=True)

        status = in_child(work)
        if status != -9:
            raise AssertionError(
                f"FormatTests could not kill an export in a child process (exit status "
                f"{status}); the child's output above says why"
            )
        try:
            found = difference(old, self._load(path))
        except (StructError, OSError) as err:
            found = f"loading it raised {type(err).__name__}: {err}"
        if found is not None:
            raise self._broken(
                "a killed export leaves the previous checkpoint loadable",
                found,
                "write only inside the target path write() is given; never open, move or "
                "delete the previous checkpoint (jaxstruct publishes the new one atomically)",
            )
        self._export(new, path, overwrite=True)
        if difference(new, self._load(path)) is not None or self._beside(path):
            raise self._broken(
                "after a killed export, the next export to the path succeeds",
                f"left {self._beside(path)}",
                "write only inside the target path write() is given",
            )

    # -- hostile and damaged files --------------------------------------------------------------

    def test_damaged_checkpoints_raise_only_jaxstruct_errors(self, tmp_path: Path) -> None:
        """Cut, garbled and partly removed checkpoints: sniff() answers without raising, and
        open() and read_arrays() raise only jaxstruct's errors (SerializationError; a
        removed member may be a FileNotFoundError)."""
        problems: list[str] = []
        for copy, what, _, table in self._damaged(tmp_path):
            try:
                self._sniffs(copy, what)
            except AssertionError as err:
                problems.append(str(err).splitlines()[1].strip())
            raw = self._open_and_read(copy, table)
            if raw is not None:
                problems.append(f"{what}: open() or read_arrays() raised {raw}")
            if len(problems) >= 3:
                break
        if problems:
            raise self._broken(
                "damaged checkpoints raise jaxstruct's errors, never the parser's",
                "; ".join(problems),
                "check sizes and counts before reading, and turn your parser's errors into "
                "jaxstruct.registry.SerializationError naming the file (raise ... from None)",
            )

    def test_damaged_checkpoints_never_load_as_other_data(self, tmp_path: Path) -> None:
        """Cut, garbled and partly removed checkpoints: load() raises jaxstruct's error or
        gives back the exact value, never other data."""
        problems: list[str] = []
        for copy, what, value, _ in self._damaged(tmp_path):
            try:
                back = self._load(copy)
            except (StructError, OSError):
                continue
            found = difference(value, back)
            if found is not None:
                problems.append(f"{what}: load() gave other data ({found})")
            if len(problems) >= 3:
                break
        if problems:
            raise self._broken(
                "damaged checkpoints never load as other data",
                "; ".join(problems),
                "check every size before reading, and store a checksum per array (or leave "
                "it to jaxstruct: Format.checks_arrays = False, the default)",
            )

    def _damaged(self, tmp_path: Path) -> Iterator[tuple[Path, str, Any, Mapping[str, ArraySpec]]]:
        """Damaged copies of one checkpoint: ``(path, what was done, the value, its arrays
        table)``."""
        value = {"probe": PROBE, "w": np.linspace(-1, 1, 64), "i": np.arange(40, dtype=np.int32)}
        good = self._export(value, self._path(tmp_path, "good"))
        opened = self.format.open(good, Limits())
        try:
            table = self._table(opened.manifest)
        finally:
            opened.close()
        for n, damage in enumerate(damages(good)):
            copy = copy_checkpoint(good, self._path(tmp_path, f"damaged-{n}"))
            damage.apply(copy)
            yield copy, damage.name, value, table

    def _open_and_read(self, path: Path, table: Mapping[str, ArraySpec]) -> str | None:
        """Call open() and read_arrays() (every array of the undamaged checkpoint's
        ``table``) directly: the foreign exception that came out, or None."""
        try:
            opened = self.format.open(path, Limits())
        except (StructError, FileNotFoundError):  # (a removed member may be named as missing)
            return None
        except Exception as err:
            return f"{type(err).__name__}: {err}"
        try:
            opened.read_arrays(table, dict.fromkeys(table))
        except StructError:
            return None
        except Exception as err:
            return f"{type(err).__name__}: {err}"
        finally:
            with contextlib.suppress(Exception):
                opened.close()
        return None

    def test_damaged_array_data_is_found(self, tmp_path: Path) -> None:
        """A changed byte inside an array's stored data makes load() and
        `jaxstruct inspect --verify` fail with jaxstruct's error naming the checkpoint."""
        from jaxstruct.io._cli import main

        data = np.random.default_rng(3).standard_normal(256)
        value = {"w": data}
        good = self._export(value, self._path(tmp_path, "good"))
        damage = flip_inside(good, data.tobytes()[512:1024])
        if damage is None:
            pytest.skip("the format does not store arrays as their raw bytes (encoded)")
        path = copy_checkpoint(good, self._path(tmp_path, "damaged"))
        damage.apply(path)
        try:
            back = self._load(path)
        except SerializationError as err:
            if path.name not in str(err):
                raise self._broken(
                    "errors about a damaged checkpoint name it",
                    str(err),
                    "put repr(str(path)) in your SerializationError messages",
                ) from None
        else:
            raise self._broken(
                "a changed byte of array data is found on load",
                f"{damage.name} loaded without an error "
                f"({'other data' if difference(value, back) else 'the same data'})",
                "store a checksum per array and check it on every read, or leave it to "
                "jaxstruct (Format.checks_arrays = False, the default: jaxstruct checksums "
                "what it hands write() and checks what read_arrays returns)",
            )
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["inspect", "--verify", str(path)])
        if status == 0:
            raise self._broken(
                "`jaxstruct inspect --verify` finds a changed byte of array data",
                f"it exited 0 ({out.getvalue().strip().splitlines()[-1]})",
                "give the opened checkpoint a verify(table) checking the stored checksums "
                "(verify_by_reading when every read checks them)",
            )

    def test_a_damaged_manifest_is_found(self, tmp_path: Path) -> None:
        """A changed byte inside a string of the stored manifest (still valid JSON) makes
        load() fail with jaxstruct's error naming the checkpoint."""
        good = self._export({"tag": PROBE, "w": np.arange(3.0)}, self._path(tmp_path, "good"))
        damage = flip_inside(good, PROBE.encode())
        if damage is None:
            pytest.skip("the format does not store the manifest as its bytes (encoded)")
        path = copy_checkpoint(good, self._path(tmp_path, "damaged"))
        damage.apply(path)
        try:
            back = self._load(path)
        except SerializationError as err:
            if path.name not in str(err):
                raise self._broken(
                    "errors about a damaged checkpoint name it",
                    str(err),
                    "put repr(str(path)) in your SerializationError messages",
                ) from None
            return
        raise self._broken(
            "a changed byte of the stored manifest is found on load",
            f"{damage.name} loaded as {back.get('tag')!r}",
            "store the manifest bytes exactly as write() was given them (jaxstruct seals "
            "them), or keep a checksum of them and check it in open()",
        )

    def test_open_enforces_the_manifest_size_limit(self, tmp_path: Path) -> None:
        """open() refuses a manifest larger than limits.max_manifest_bytes before reading it,
        with jaxstruct's error naming the limit."""
        path = self._export({"w": np.arange(3.0)}, self._path(tmp_path))
        try:
            opened = self.format.open(path, Limits(max_manifest_bytes=16))
        except SerializationError as err:
            if "max_manifest_bytes" not in str(err):
                raise self._broken(
                    "the error of a limit names it, so users can raise it",
                    str(err),
                    "say max_manifest_bytes= in the message",
                ) from None
            return
        except Exception as err:
            raise self._broken(
                "open() refuses a manifest over max_manifest_bytes with SerializationError",
                f"{type(err).__name__}: {err}",
                "raise jaxstruct.registry.SerializationError",
            ) from err
        opened.close()
        raise self._broken(
            "open() refuses a manifest over limits.max_manifest_bytes before reading it",
            "it opened a checkpoint whose manifest is over max_manifest_bytes=16",
            "compare the stored manifest's size with limits.max_manifest_bytes before "
            "reading it, and raise SerializationError naming max_manifest_bytes=",
        )

    def test_compression_is_honoured_or_refused(self, tmp_path: Path) -> None:
        """compression="auto" always works; "deflate" makes a smaller checkpoint of
        compressible arrays or is refused, "none" stores arrays uncompressed or is refused,
        a refusal being a SerializationError that says compression, with nothing written."""
        value = {"zeros": np.zeros(1 << 17, np.float32), "ramp": np.arange(1 << 12, dtype=np.int32)}
        raw = sum(v.nbytes for v in value.values())
        sizes: dict[str, int] = {}
        for compression in ("auto", "deflate", "none"):
            path = self._path(tmp_path, compression)
            try:
                self._export(value, path, compression=compression)
            except SerializationError as err:
                cause = err.__cause__
                if cause is not None and not isinstance(cause, StructError):
                    raise self._broken(
                        "a compression value the format cannot honour is refused with "
                        "SerializationError",
                        f"compression={compression!r}: write() raised {type(cause).__name__}: "
                        f"{cause}",
                        "raise jaxstruct.registry.SerializationError naming the value",
                    ) from None
                if compression == "auto" or "compression" not in str(err).lower():
                    raise self._broken(
                        'compression="auto" is always accepted, and a refused value is named'
                        if compression == "auto"
                        else "a refused compression value is refused by name",
                        f"compression={compression!r}: {err}",
                        'accept "auto" (the default: the format chooses); refuse what you '
                        "cannot honour with SerializationError(\"... compression='deflate' "
                        '...") before writing',
                    ) from None
                left = [p.name for p in tmp_path.iterdir() if path.name in p.name]
                if left:
                    raise self._broken(
                        "a refused compression writes nothing",
                        f"left {left}",
                        "refuse before writing anything",
                    ) from None
                continue
            found = difference(value, self._load(path))
            if found is not None:
                raise self._broken(f"compression={compression!r} round-trips", found, "see above")
            sizes[compression] = size_of(path)
        if "none" in sizes and sizes["none"] < raw:
            raise self._broken(
                'compression="none" stores arrays uncompressed',
                f"{sizes['none']} bytes for {raw} bytes of arrays",
                'store arrays as they are with "none" (or refuse it)',
            )
        if "deflate" in sizes and "none" in sizes and sizes["deflate"] >= sizes["none"] // 2:
            raise self._broken(
                'compression="deflate" compresses the arrays (or is refused)',
                f"{sizes['deflate']} bytes with deflate, {sizes['none']} without, for a "
                "megabyte of zeros",
                'compress with "deflate", or refuse it with a SerializationError naming '
                "compression (the tar example does)",
            )


def _open_fds() -> int | None:
    """How many files this process has open (Linux), or ``None`` where it cannot be told."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
