"""Loading a stranger's file: no imports, no pickle, limits, strict structure, clean errors."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError


def _write_manifest(path: Path, edit) -> None:
    top = json.loads((path / "manifest.json").read_text())
    top.pop("checksum", None)  # a hand-edited manifest carries no checksum
    edit(top)
    (path / "manifest.json").write_bytes(jio.seal_manifest(top))  # edited on purpose


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A small directory checkpoint."""
    return jio.export({"w": [np.arange(4.0)], "n": 3}, tmp_path / "c")


def test_unknown_class_is_refused_without_importing(ckpt: Path) -> None:
    """An unknown class is refused naming the three ways out, and nothing is imported."""

    def edit(top: dict[str, Any]) -> None:
        top["manifest"]["nodes"] = [["struct", "jaxstruct_io_evil_module:Boom", 0, {}]]
        top["manifest"]["root"] = 0
        top["arrays"] = {}

    _write_manifest(ckpt, edit)
    (ckpt / "arrays.npz").unlink()
    jio.export({}, ckpt.parent / "empty")
    os.replace(ckpt.parent / "empty" / "arrays.npz", ckpt / "arrays.npz")
    with pytest.raises(SerializationError) as info:
        jio.load(ckpt)
    message = str(info.value)
    assert "jaxstruct_io_evil_module:Boom" in message
    assert "load_cls" in message and "allow_imports" in message and "import or define" in message
    assert "jaxstruct_io_evil_module" not in sys.modules


def test_allow_imports_permits_named_modules_only(tmp_path: Path) -> None:
    """allow_imports imports only the listed modules (and submodules) to resolve classes."""
    payload = jio.to_state_dict([1])
    payload["manifest"]["nodes"] = [["enum", "http:HTTPStatus", "OK"]]
    payload["manifest"]["root"] = 0
    with pytest.raises(SerializationError, match="allow_imports"):
        jio.from_state_dict(payload, allow_imports=["json"])
    import http

    assert jio.from_state_dict(payload, allow_imports=["http"]) is http.HTTPStatus.OK


def test_duplicate_json_keys_are_rejected(ckpt: Path) -> None:
    """A manifest with a duplicate key is a SerializationError."""
    text = (ckpt / "manifest.json").read_text()
    (ckpt / "manifest.json").write_text(
        text.replace('"format":"jaxstruct"', '"format":"jaxstruct","format":"jaxstruct"')
    )
    with pytest.raises(SerializationError, match="duplicate"):
        jio.load(ckpt)


def test_unknown_format_version_is_rejected(ckpt: Path) -> None:
    """A newer format version says to upgrade."""
    _write_manifest(ckpt, lambda top: top.update(version=99))
    with pytest.raises(SerializationError, match="upgrade"):
        jio.load(ckpt)


@pytest.mark.parametrize(
    ("limit", "value"),
    [("max_manifest_bytes", 100), ("max_depth", 1), ("max_nodes", 3), ("max_array_bytes", 16)],
)
def test_limits_are_enforced_and_can_be_raised(ckpt: Path, limit: str, value: int) -> None:
    """Each limit refuses a checkpoint that exceeds it, names its keyword, and can be raised."""
    with pytest.raises(SerializationError, match=limit):
        jio.load(ckpt, **{limit: value})
    jio.load(ckpt, **{limit: value * 1000})


def test_inflation_ratio_limit(tmp_path: Path) -> None:
    """A compressed member inflating beyond max_inflation_ratio is refused before allocation."""
    path = jio.export(np.zeros(1 << 20), tmp_path / "z.zip", compression="deflate")
    with pytest.raises(SerializationError, match="max_inflation_ratio"):
        jio.load(path, max_inflation_ratio=10)
    assert jio.load(path).shape == (1 << 20,)


def test_unknown_limit_keyword_is_a_type_error(ckpt: Path) -> None:
    """A misspelt limit keyword is a TypeError listing the valid ones."""
    with pytest.raises(TypeError, match="max_depth"):
        jio.load(ckpt, max_dept=3)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_refused_without_hanging(ckpt: Path) -> None:
    """A FIFO in place of a member file is refused immediately."""
    (ckpt / "manifest.json").unlink()
    os.mkfifo(ckpt / "manifest.json")
    result: list[BaseException] = []
    thread = threading.Thread(target=lambda: _capture(result, ckpt), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "load hung on a FIFO"
    assert isinstance(result[0], SerializationError) and "regular file" in str(result[0])


def _capture(result: list[BaseException], path: Path) -> None:
    try:
        jio.load(path)
    except BaseException as err:
        result.append(err)


def test_symlinked_member_is_refused(ckpt: Path, tmp_path: Path) -> None:
    """A symlink inside a checkpoint directory is refused."""
    (tmp_path / "elsewhere.json").write_bytes((ckpt / "manifest.json").read_bytes())
    (ckpt / "manifest.json").unlink()
    (ckpt / "manifest.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(SerializationError, match=r"symbolic link|regular"):
        jio.load(ckpt)


def test_extra_array_member_is_refused(ckpt: Path) -> None:
    """The archive must hold exactly the arrays the manifest names."""
    with zipfile.ZipFile(ckpt / "arrays.npz", "a") as archive:
        archive.writestr("extra.npy", b"x")
    with pytest.raises(SerializationError, match="exactly the arrays"):
        jio.load(ckpt)


def test_missing_array_member_is_refused(ckpt: Path) -> None:
    """An array named by the manifest but absent from the archive is refused."""
    _write_manifest(ckpt, lambda top: top["arrays"].update(a9={"dtype": "<f8", "shape": [1]}))
    with pytest.raises(SerializationError):
        jio.load(ckpt)


def test_shape_mismatch_is_refused(ckpt: Path) -> None:
    """A manifest shape that does not match the stored data is refused."""
    _write_manifest(ckpt, lambda top: top["arrays"]["a0"].update(shape=[2, 2]))
    with pytest.raises(SerializationError, match="shape"):
        jio.load(ckpt)


def test_object_dtype_in_npy_header_is_refused(ckpt: Path) -> None:
    """An array member declaring an object dtype is refused (no pickle anywhere)."""
    _write_manifest(ckpt, lambda top: top["arrays"]["a0"].update(dtype="|O"))
    with pytest.raises(SerializationError, match="dtype"):
        jio.load(ckpt)


def test_arrays_are_readable_by_numpy_without_pickle(ckpt: Path, tmp_path: Path) -> None:
    """arrays.npz, alone or inside the .zip archive, loads with numpy.load(allow_pickle=False)."""
    with np.load(ckpt / "arrays.npz", allow_pickle=False) as npz:
        assert np.array_equal(npz["a0"], np.arange(4.0))
    path = jio.export({"w": np.arange(3)}, tmp_path / "x.zip")
    with zipfile.ZipFile(path) as archive:
        inner = archive.read("arrays.npz")
    with np.load(io.BytesIO(inner), allow_pickle=False) as npz:
        assert np.array_equal(npz["a0"], np.arange(3))


def test_missing_path_is_file_not_found(tmp_path: Path) -> None:
    """Loading a path that does not exist raises FileNotFoundError."""
    with pytest.raises(FileNotFoundError):
        jio.load(tmp_path / "nope")


def test_not_a_checkpoint_is_a_serialization_error(tmp_path: Path) -> None:
    """A random file or an empty directory is a SerializationError naming the path."""
    (tmp_path / "f.zip").write_bytes(b"hello")
    (tmp_path / "d").mkdir()
    for path in (tmp_path / "f.zip", tmp_path / "d"):
        with pytest.raises(SerializationError, match=str(path.name)):
            jio.load(path)


def test_corrupt_array_data_fails_the_crc(tmp_path: Path) -> None:
    """Flipped bits in stored array data are detected."""
    ckpt = jio.export([np.arange(4.0)], tmp_path / "c", compression="none")
    data = bytearray((ckpt / "arrays.npz").read_bytes())
    pos = data.find(b"\x00\x00\x00\x00\x00\x00\xf0\x3f")  # 1.0 as float64
    assert pos > 0
    data[pos + 7] ^= 0xFF
    (ckpt / "arrays.npz").write_bytes(bytes(data))
    with pytest.raises(SerializationError, match="CRC"):
        jio.load(ckpt)


def test_user_code_errors_become_serialization_errors() -> None:
    """An exception from a class's own code while rebuilding is wrapped with the tree path."""
    payload = jio.to_state_dict({"p": __import__("pathlib").PurePosixPath("a")})
    payload["manifest"]["nodes"][1] = ["enum", "enum:Enum", "X"]
    with pytest.raises(SerializationError, match=r"root"):
        jio.from_state_dict(payload)


def test_allow_imports_none_allows_nothing_and_a_non_list_is_named(tmp_path: Path) -> None:
    path = jio.export({"w": 1}, tmp_path / "ck")
    assert jio.load(path, allow_imports=None) == {"w": 1}
    with pytest.raises(TypeError, match="allow_imports expected module names, got 3"):
        jio.load(path, allow_imports=3)  # pyright: ignore[reportArgumentType]
