"""Run every jaxstruct benchmark and print the Markdown report.

    uv run --group bench python benchmarks/run.py               # everything
    uv run --group bench python benchmarks/run.py --core-only   # only bench_core.py
    uv run --group bench python benchmarks/run.py -- ARGS       # ARGS go to bench_io.py
    uv run --group bench python benchmarks/run.py --orbax-only -- ARGS  # only bench_orbax.py

The report starts by naming the interpreter (implementation and version; any
of the supported CPythons, 3.11 to 3.13, runs it). The core benchmark runs in
this process; ``bench_io.py`` and ``bench_orbax.py``, when they exist, run
afterwards, each in a fresh process of the same interpreter, so that no one's
imports, caches or garbage skew another's timings.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IO_SCRIPT = HERE / "bench_io.py"
ORBAX_SCRIPT = HERE / "bench_orbax.py"


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    import bench_core

    io_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, io_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--core-only", action="store_true", help="run only bench_core.py")
    which.add_argument("--io-only", action="store_true", help="run only bench_io.py")
    which.add_argument(
        "--orbax-only",
        action="store_true",
        help="run only bench_orbax.py (ARGS after -- go to it)",
    )
    bench_core.add_arguments(parser)
    return parser.parse_args(argv), io_args


def _run_script(script: Path, args: list[str]) -> int:
    if not script.exists():
        print(f"(no {script.name}: skipped)", file=sys.stderr, flush=True)
        return 0
    print(f"[run] {script.name} {' '.join(args)}".rstrip(), file=sys.stderr, flush=True)
    # Inherit stdout/stderr: its report is printed as it comes, after the previous one.
    status = subprocess.call([sys.executable, str(script), *args], cwd=HERE.parent)
    if status:
        print(f"[run] {script.name} exited with {status}", file=sys.stderr)
    print(flush=True)
    return status


def interpreter() -> str:
    """Name the running interpreter, e.g. ``CPython 3.12.1 (Linux x86_64)``."""
    system = f"{platform.system()} {platform.machine()}".strip()
    return f"{platform.python_implementation()} {platform.python_version()} ({system})"


def main(argv: list[str]) -> int:
    """Run the selected benchmarks; return a process exit status."""
    sys.path.insert(0, str(HERE))
    args, io_args = _parse(argv)
    started = time.perf_counter()
    print(f"Interpreter: {interpreter()}.\n", flush=True)
    status = 0
    check = ["--check"] if args.check else []
    if not (args.io_only or args.orbax_only):
        import bench_core

        status = bench_core.main(args)
        print(flush=True)
    if not (args.core_only or args.orbax_only):
        status = _run_script(IO_SCRIPT, [*io_args, *check]) or status
    if not (args.core_only or args.io_only):
        orbax_args = io_args if args.orbax_only else []
        status = _run_script(ORBAX_SCRIPT, [*orbax_args, *check]) or status
    print(f"[run] all benchmarks took {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
