"""Checkpoints in S3: jaxstruct's "orbax" format against orbax-checkpoint on the same server.

moto's S3-compatible server (``moto[server]``, the dev group) runs on
127.0.0.1 for the whole run; every operation runs in a fresh Python process
(imports and a warm-up on a tiny array not timed), JAX arrays in and out,
peak memory read from ``VmHWM`` (reset just before the operation) minus the
resident size just before it. The data is incompressible float32 (``--mib``,
default 256 MiB) sharded by rows over 8 CPU devices and restored with the
same sharding.

* **orbax**: ``StandardCheckpointer`` save / restore with the abstract target,
  committed by its commit marker (``CommitFileTemporaryPath``, what the
  format uses in object stores). orbax-checkpoint 0.12 cannot build a
  tensorstore spec for ``s3://`` on its own, so it gets the same routing the
  format installs (``jaxstruct.orbax._orbax_internals.route_s3``): the
  arrays take the same path through tensorstore's ``s3`` driver on both sides.
* **jaxstruct**: ``export(format="orbax")`` / ``load(target=...)``.

Targets (issue 22), as same-run ratios (median of the per-round ratios):
save and restore time <= 1.0x orbax's; peak RSS growth <= 0.3 GiB on save
and <= 1.1x the data on restore (worst round). moto is a Python server: the
absolute times say more about it than about either client.

Run:  uv run --frozen --all-packages python benchmarks/bench_object_store.py [--rounds 3]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse
import gc
import importlib
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import orbax.checkpoint as ocp
from _fresh import run_child
from _memory import reset_peak, status
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

HERE = Path(__file__).resolve()


def _test_servers() -> Any:
    """The tests' moto launcher (``tests/orbax/_s3.py``): the same server, port choice and
    throwaway credentials. Its folder is no package, and its modules import each other
    relatively, so it is loaded here as a namespace package of its own."""
    package = types.ModuleType("_jaxstruct_test_servers")
    package.__path__ = [str(HERE.parent.parent / "tests" / "orbax")]
    sys.modules.setdefault(package.__name__, package)
    return importlib.import_module(f"{package.__name__}._s3")


_s3 = _test_servers()

MiB = 1 << 20
COLS = 4096
SIDES = ("orbax", "ours")


def _data(rows: int, sharding: NamedSharding) -> jax.Array:
    make = jax.jit(
        lambda: jax.random.normal(jax.random.key(0), (rows, COLS), jnp.float32),
        out_shardings=sharding,
    )
    return make().block_until_ready()


def _measure(op: Callable[[], Any]) -> dict[str, float]:
    gc.collect()
    gc.disable()
    reset_peak()
    base = status("VmRSS")
    t0 = time.perf_counter()
    result = op()
    elapsed = time.perf_counter() - t0
    peak = status("VmHWM") - base
    del result
    gc.enable()
    return {"seconds": elapsed, "peak": peak}


def _checkpointer() -> Any:
    return ocp.Checkpointer(
        ocp.StandardCheckpointHandler(),
        temporary_path_class=ocp.path.atomicity.CommitFileTemporaryPath,
    )


def _save(side: str, arr: jax.Array, url: str) -> Callable[[], Any]:
    if side == "orbax":

        def orbax_save() -> None:
            checkpointer = _checkpointer()
            checkpointer.save(url, args=ocp.args.StandardSave({"w": arr}))
            checkpointer.close()

        return orbax_save
    return lambda: jio.export({"w": arr}, url, format="orbax")


def _restore(side: str, url: str, target: jax.ShapeDtypeStruct) -> Callable[[], Any]:
    if side == "orbax":

        def orbax_restore() -> jax.Array:
            checkpointer = _checkpointer()
            args = ocp.args.StandardRestore({"w": target})
            out = checkpointer.restore(url, args=args)["w"].block_until_ready()
            checkpointer.close()
            return out

        return orbax_restore

    def ours_restore() -> jax.Array:
        return jio.load(url, target={"w": target})["w"].block_until_ready()

    return ours_restore


def _child(job: dict[str, Any]) -> dict[str, float]:
    from jaxstruct.orbax._stores import to_path

    to_path(job["url"])  # s3:// routed to tensorstore's s3 driver, for both sides
    side, url, warm = job["side"], job["url"], job["warm"]
    sharding = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
    rows = job["mib"] * MiB // (4 * COLS) // 8 * 8
    target = jax.ShapeDtypeStruct((rows, COLS), jnp.float32, sharding=sharding)
    tiny = _data(8, sharding)
    _save(side, tiny, warm)()
    if job["kind"] == "save":
        arr = _data(rows, sharding)
        return _measure(_save(side, arr, url))
    _restore(side, warm, jax.ShapeDtypeStruct((8, COLS), jnp.float32, sharding=sharding))()
    return _measure(_restore(side, url, target))


def _rounds(root: str, env: dict[str, str], mib: int, rounds: int) -> dict[str, list[Any]]:
    results: dict[str, list[Any]] = {}
    for r in range(rounds):
        print(f"[bench_object_store] round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        for kind in ("save", "restore"):
            for side in SIDES[r % 2 :] + SIDES[: r % 2]:
                job = {
                    "kind": kind,
                    "side": side,
                    "mib": mib,
                    "url": f"{root}/r{r}-{side}",
                    "warm": f"{root}/r{r}-{side}-{kind}-warm",
                }
                results.setdefault(f"{kind}-{side}", []).append(run_child(HERE, job, env))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="checkpoint size (MiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))), flush=True)
        return 0
    with _s3.moto_s3() as url:
        env = {**_s3.emulator_env(url), "JAX_PLATFORMS": "cpu"}
        res = _rounds(f"s3://{_s3.BUCKET}/bench", env, args.mib, args.rounds)
    data = args.mib * MiB
    print(f"| {args.mib} MiB, 8 shards, moto | orbax | jaxstruct | ratio (median, range) |")
    print("| --- | --- | --- | --- |")
    for kind in ("save", "restore"):
        theirs, ours = res[f"{kind}-orbax"], res[f"{kind}-ours"]
        ratios = [o["seconds"] / t["seconds"] for o, t in zip(ours, theirs, strict=True)]
        print(
            f"| {kind} time | {statistics.median(t['seconds'] for t in theirs):.2f} s "
            f"| {statistics.median(o['seconds'] for o in ours):.2f} s "
            f"| {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
        peak_t = max(t["peak"] for t in theirs)
        peak_o = max(o["peak"] for o in ours)
        print(
            f"| {kind} peak growth (worst) | {peak_t / MiB:.0f} MiB | {peak_o / MiB:.0f} MiB "
            f"| {peak_o / data:.2f}x the data |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
