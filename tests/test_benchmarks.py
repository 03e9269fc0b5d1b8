"""The benchmark scripts still run (their numbers are for benchmarks/README.md, not for tests)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _bench(script: str, *args: str, cwd: Path | None = None) -> str:
    """What ``python benchmarks/SCRIPT ARGS`` prints (it must exit 0 within 5 minutes)."""
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=cwd,
    ).stdout


def test_core_benchmark_runs_and_reports_ratios() -> None:
    """A tiny run of bench_core.py prints ratio tables for every op asked for."""
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_core.py"),
            "--rounds=2",
            "--repeats=1",
            "--target-ms=0.2",
            "--models",
            "flat",
            "hooked",
            "--impls",
            "regdc",
            "jaxstruct",
            "dict",
            "--ops",
            "flatten",
            "unflatten",
            "flatten_with_path",
            "construct",
            "replace",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "### Targets" in out
    flat = out.split("### flat", 1)[1].split("###", 1)[0]
    for op in ("flatten", "unflatten", "flatten_with_path", "construct", "replace"):
        row = next(line for line in flat.splitlines() if line.startswith(f"| {op} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4  # op, regdc time, dict / regdc, jaxstruct / regdc
        assert all(c[0].isdigit() for c in cells[2:]), row
    assert "error" not in out


def test_construction_floor_table_gives_each_class_its_chain_over_flat_ratio() -> None:
    """The floor table builds the chain model with every reference class too.

    Its last column is the chain / flat construction target's figure for each
    way of storing fields, so a run shows what that target asks of any store;
    the line after it compares a chain with one link of the same class.
    """
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import bench_core\n"
        "from _harness import Settings\n"
        "from _models import load_impls\n"
        "impls, _ = load_impls(['regdc', 'jaxstruct'])\n"
        "settings = Settings(rounds=2, repeats=1, target=0.0002)\n"
        "flat, chain = bench_core._construct_floor(impls, bench_core._leaves(), settings)\n"
        "print(bench_core._floor_table(flat, chain))\n"
        "print(bench_core._depth_line(chain))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(BENCH)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    *table, depth = out.strip().splitlines()
    header, _, *rows = table
    assert header.endswith("| chain of 50: ratio to regdc | chain / flat |"), header
    names = [row.strip("|").split("|")[0].strip() for row in rows]
    assert names == ["plain", "frozen", "dict fill", "regdc", "jaxstruct"]
    for row in rows:
        chain_over_flat = row.strip("|").split("|")[-1].strip()
        assert float(chain_over_flat) > 0, row
    # The same class built alone and as a chain: what depth itself costs.
    assert depth.startswith("Depth alone: `jaxstruct` builds one chain link by itself at "), depth


def test_benchmark_report_names_the_interpreter() -> None:
    """benchmarks/run.py starts its report with the interpreter's implementation and version."""
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run.py"),
            "--core-only",
            "--rounds=1",
            "--repeats=1",
            "--target-ms=0.1",
            "--models",
            "flat",
            "--impls",
            "regdc",
            "jaxstruct",
            "--ops",
            "flatten",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    named = f"Interpreter: {platform.python_implementation()} {platform.python_version()} ("
    assert out.startswith(named), out.splitlines()[0]


def test_orbax_benchmark_runs_through_run_py_and_reports_every_row() -> None:
    """``run.py --orbax-only -- ARGS`` runs bench_orbax.py: its rows, each with a verdict."""
    out = _bench("run.py", "--orbax-only", "--", "--gib=0.01", "--small=50", "--rounds=1")
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]
    assert [c[0].split()[0] for c in cells] == [
        "save",
        "save:",
        "restore",
        "restore:",
        "blocking",
        "save",
    ]
    assert all(c[-1] in ("met", "**missed**") for c in cells), rows
    assert cells[1][3].startswith("+") and cells[1][3].endswith("GiB")  # our peak, from VmHWM
    assert cells[3][1].startswith("+") and cells[3][1].endswith("x data")


def test_orbax_mesh_restore_benchmark_runs_and_reports_both_rows() -> None:
    """bench_mesh_restore.py compares load(mesh=) with a hand-built target: time and peak."""
    out = _bench("bench_mesh_restore.py", "--gib=0.01", "--rounds=1", cwd=BENCH)
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]
    assert [c[0] for c in cells] == ["time", "peak RSS growth"], rows
    assert all(c[-1] in ("met", "**missed**") for c in cells), rows


def test_safetensors_benchmark_runs_and_reports_every_target() -> None:
    """A tiny run of bench_safetensors.py prints its four targets, each with a verdict."""
    out = _bench("bench_safetensors.py", "--gib=0.004", "--rounds=1")
    targets = out.split("### Targets", 1)[1]
    rows = [line for line in targets.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 5, rows  # the heading and four targets
    assert all(row.rstrip(" |").endswith(("met", "MISSED")) for row in rows[1:]), rows


def test_checksums_benchmark_runs_and_reports_every_ratio() -> None:
    """A tiny run of bench_checksums.py times the docs' format in its three variants and
    prints the CRC pass's share of export and load, each a target with a verdict, and
    four ratios beside them."""
    out = _bench("bench_checksums.py", "--gib=0.004", "--rounds=1")
    assert "The CRC pass alone (median):" in out
    table = out.split("### Ratios", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 7, rows  # the heading, two targets and four ratios shown
    verdicts = [row.rstrip(" |").rsplit("| ", 1)[1] for row in rows[1:]]
    assert all(v in ("met", "MISSED") for v in verdicts[:2]), rows
    assert verdicts[2:] == ["shown"] * 4, rows


def test_object_store_benchmark_starts_the_tests_server_and_reports_every_row() -> None:
    """A tiny run of bench_object_store.py starts the tests' moto server (its launcher is
    imported from tests/orbax) and prints save and restore time and peak for both sides."""
    out = _bench("bench_object_store.py", "--mib=8", "--rounds=1")
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    assert rows[2:] == [
        "save time",
        "save peak growth (worst)",
        "restore time",
        "restore peak growth (worst)",
    ], out


def test_chain_target_divides_the_chain_ratio_by_one_links() -> None:
    """The chain target checks depth alone: chain ratio over one link's, same classes."""
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r})\n"
        "import bench_core as b\n"
        "from _harness import CellResult\n"
        "L = b.ONE_LINK\n"
        "times = {b.SUBJECT: [2.0, 2.0], b.BASE: [1.0, 1.0],\n"
        "         b.SUBJECT + L: [3.0, 3.0], b.BASE + L: [2.0, 2.0]}\n"
        "chain = CellResult('chain', 'construct floor', times)\n"
        "report = b.Report({}, {}, None, chain, (0.0, 0.0), [], {}, None, 0.0)\n"
        "v = next(v for v in b._verdicts(report) if v.what.startswith('construct: chain'))\n"
        "print(v.what, round(v.ratio.median, 4), v.ok)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    # chain 2.0 / 1.0 against one link 3.0 / 2.0: 2 / 1.5 = 1.3333, over 1.10
    assert out == "construct: chain of 50 ratio / one-link ratio 1.3333 False", out


def test_io_small_benchmark_reports_the_floor_of_our_layout() -> None:
    """bench_io.py --only small gives both small-cycle rows and, beside them, the floor of our
    layout (its system calls alone), which says whether the targets are within the disk's reach."""
    out = _bench("bench_io.py", "--only", "small", "--rounds=1")
    rows = [line for line in out.splitlines() if line.startswith("| small checkpoint")]
    assert len(rows) == 2, out
    assert all(" pass |" in row or " FAIL |" in row for row in rows), rows
    floor = rows[0].split("our layout's system calls alone + one device_put ", 1)[1]
    rate, ratio = floor.split("/s (numpy/floor ", 1)
    assert float(rate) > 0 and float(ratio.split(")", 1)[0]) > 0, rows[0]


def test_construction_target_follows_the_interpreter() -> None:
    """0.60x regdc from CPython 3.13 on (dict stores); no slower than regdc before (issue 24)."""
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r})\n"
        "import bench_core as b\n"
        "print(sorted({t.limit for t in b.TARGETS if t.label == 'construct, no hooks'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    assert out == ("[0.6]" if sys.version_info >= (3, 13) else "[1.0]"), out


def test_accel_benchmark_reports_the_limits_every_side_and_the_targets() -> None:
    """A tiny run of bench_accel.py (issue 35) on this backend: the four limits, each side
    asked for with save and load figures, each target of the built-in format with a
    verdict, and the cost of jaxstruct's checksums on the docs' minimum format (issue 45)."""
    # Few sides keep it short (each figure is a fresh process); the harness is the same
    # for every side.
    out = _bench("bench_accel.py", "--size=2M", "--sides", "zip-none", "rawdir", "rawdir-unchecked")
    for op in ("save", "load-warm"):
        assert f"jaxstruct's checksums on the docs' minimum format, {op}: " in out, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    names = [row.split("|")[1].strip() for row in rows]
    assert names[1:7] == [
        "device-to-host copy (limit)",
        "host-to-device copy (limit)",
        "write+fsync of the bytes (limit)",
        "the same, made durable as the directory format does",
        "read of the bytes (limit)",
        '`.zip`, `compression="none"`',
    ], out
    targets = [row for row in rows if row.rstrip(" |").endswith(("met", "**missed**"))]
    assert len(targets) == 4, out  # export time, export memory, load cold, load warm
