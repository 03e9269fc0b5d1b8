"""Restoring without a template: ``load(path, mesh=)`` against a hand-built target.

A checkpoint of incompressible float32 (``--gib``, default 1 GiB) sharded by
rows over a (4, 2) mesh of 8 CPU devices (``P("data", "model")``) is written
once with ``format="orbax"``. Each round restores it in fresh processes (the
two sides in an order rotated from round to round), after a warm-up on a tiny
checkpoint, reading from the page cache:

* **target**: ``load(path, target=...)`` with a ``jax.ShapeDtypeStruct``
  carrying the saved sharding, built by hand;
* **mesh**: ``load(path, mesh=mesh)``, the sharding taken from the checkpoint.

Target (issue 22): time and peak RSS growth (``VmHWM``) of ``mesh`` within
1.1x of ``target`` (median of the per-round ratios; worst round for memory).

Run:  uv run --frozen --all-packages python benchmarks/bench_mesh_restore.py [--gib 1] [--check]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
from _fresh import run_child
from bench_orbax import COLS, GiB, _data, _measure, _shape
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

HERE = Path(__file__).resolve()
SIDES = ("target", "mesh")
SPEC = P("data", "model")


def _mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"))


def _restore(side: str, path: Path, shape: tuple[int, int]) -> Any:
    mesh = _mesh()
    target = {"w": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, SPEC))}

    def restore() -> jax.Array:
        if side == "mesh":
            return jio.load(path, mesh=mesh)["w"].block_until_ready()
        return jio.load(path, target=target)["w"].block_until_ready()

    return restore


def _save(path: Path, shape: tuple[int, int]) -> None:
    jio.export({"w": _data(*shape, NamedSharding(_mesh(), SPEC))}, path, format="orbax")


def _child(job: dict[str, Any]) -> dict[str, float]:
    side, path, warm = job["side"], Path(job["path"]), Path(job["warm"])
    if not warm.exists():
        _save(warm, (8, 8))
    _restore(side, warm, (8, 8))()
    return _measure(_restore(side, path, _shape(job["gib"])))


def _run(job: dict[str, Any]) -> dict[str, float]:
    return run_child(HERE, job)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the sharded array")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process rounds")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="bench-mesh-"))
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    try:
        _save(root / "ck", _shape(args.gib))
        for r in range(args.rounds):
            print(f"[bench_mesh_restore] round {r + 1}/{args.rounds}", file=sys.stderr)
            for side in SIDES[r % 2 :] + SIDES[: r % 2]:
                job = {"side": side, "path": str(root / "ck"), "warm": str(root / "warm")}
                results[side].append(_run({**job, "gib": args.gib}))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    nbytes = _shape(args.gib)[0] * COLS * 4
    times = [
        m["seconds"] / t["seconds"] for m, t in zip(results["mesh"], results["target"], strict=True)
    ]
    peaks = [
        m["peak"] / max(1, t["peak"])
        for m, t in zip(results["mesh"], results["target"], strict=True)
    ]
    rows = [
        (
            "time",
            "s",
            [m["seconds"] for m in results["target"]],
            [m["seconds"] for m in results["mesh"]],
            statistics.median(times),
            times,
        ),
        (
            "peak RSS growth",
            "x data",
            [m["peak"] / nbytes for m in results["target"]],
            [m["peak"] / nbytes for m in results["mesh"]],
            max(peaks),
            peaks,
        ),
    ]
    load = os.getloadavg()[0]
    print(
        f"### restore {nbytes / GiB:.3g} GiB without a template ({os.cpu_count()} cores, load "
        f"average {load:.1f} at the end, {args.rounds} rounds, "
        f"{time.perf_counter() - started:.0f} s)\n"
    )
    print("| measure | target= (hand-built) | mesh= | mesh / target | target | result |")
    print("| --- | --- | --- | --- | --- | --- |")
    missed = 0
    for name, unit, ours_target, ours_mesh, ratio, each in rows:
        ok = ratio <= 1.1
        missed += not ok
        print(
            f"| {name} | {statistics.median(ours_target):.2f} {unit} | "
            f"{statistics.median(ours_mesh):.2f} {unit} | {ratio:.2f} "
            f"({min(each):.2f}-{max(each):.2f}) | <= 1.10 | "
            f"{'met' if ok else '**missed**'} |"
        )
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
