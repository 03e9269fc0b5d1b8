"""The ``jaxstruct inspect`` command and :func:`jaxstruct.io.inspect`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.io._cli import main


class Model(js.Struct):
    weights: Any
    name: str = js.field(static=True, default="m")


def test_inspect_shows_classes_fields_shapes_and_sizes(tmp_path: Path) -> None:
    """The tree names class, fields, array dtypes, shapes, sizes and the format version."""
    path = jio.export(Model(weights={"w": np.zeros((2, 3), np.float32)}), tmp_path / "m.zip")
    text = str(jio.inspect(path))
    assert ":Model (struct)" in text
    assert ".weights [node]: dict" in text and ".name [static]: str 'm'" in text
    assert "array <f4[2, 3] 24 B" in text
    assert "format version 2" in text and "zip checkpoint" in text


def test_inspect_does_not_need_the_class(tmp_path: Path) -> None:
    """Inspecting never resolves classes: an unknown class reference is simply shown."""
    path = jio.export(Model(weights=1), tmp_path / "m")
    edited = json.loads((path / "manifest.json").read_text().replace(":Model", ":Nowhere"))
    (path / "manifest.json").write_bytes(jio.seal_manifest(edited))  # edited on purpose
    assert ":Nowhere (struct)" in jio.inspect(path).tree


def test_cli_main_prints_the_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`jaxstruct inspect PATH` prints the report and exits 0."""
    path = jio.export([np.ones(4)], tmp_path / "c")
    assert main(["inspect", str(path)]) == 0
    assert "array <f8[4] 32 B" in capsys.readouterr().out


def test_cli_reports_errors_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing or malformed checkpoint is reported on stderr with exit status 2."""
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "error" in capsys.readouterr().err


def test_console_script_is_installed(tmp_path: Path) -> None:
    """The `jaxstruct` console script runs `inspect`."""
    exe = shutil.which("jaxstruct", path=str(Path(sys.executable).parent))
    assert exe is not None
    path = jio.export({"a": 1}, tmp_path / "c")
    out = subprocess.run([exe, "inspect", str(path)], check=True, capture_output=True, text=True)
    assert "directory checkpoint" in out.stdout


def test_inspect_and_verify_run_without_importing_jax(tmp_path: Path) -> None:
    """`jaxstruct inspect --json --verify` reads a checkpoint of JAX arrays with JAX unloaded."""
    import jax.numpy as jnp

    path = jio.export(Model(weights={"w": jnp.arange(6.0)}), tmp_path / "m.zip")
    code = (
        "import json, sys\n"
        "from jaxstruct.io._cli import main\n"
        "sys.argv = ['jaxstruct', 'inspect', sys.argv[1], '--json', '--verify']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "print('jax' in sys.modules, 'jaxlib' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    *report, imported = out.stdout.strip().splitlines()
    info = json.loads("\n".join(report))
    assert info["verify"] == {"ok": True, "problems": [], "checksums": True}
    assert "<f4[6]" in json.dumps(info["tree"])
    assert imported == "False False"
