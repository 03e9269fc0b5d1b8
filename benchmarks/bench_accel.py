"""Checkpoints where models live: bf16 weights on the default device, against the physical limits.

One command for issue 35: on whatever JAX backend is present (CPU in CI, a GPU
where there is one) it makes a bf16 random-normal model of ``--size`` bytes
(a few transformer-like layers of matrices, norms and biases) living on the
default device, and measures, each operation in a fresh Python process (JAX
and the libraries imported and the same operation warmed up on a tiny model
first, not timed; peak host memory from ``VmHWM``, reset just before the
operation, minus the resident size just before it):

* **save** and **load** (into a target with the arrays' device sharding) of
  jaxstruct's ``.zip`` and directory checkpoints (default compression and
  ``compression="none"``), ``format="orbax"`` and ``.safetensors``, orbax's
  ``StandardCheckpointer`` and ``safetensors.flax`` (``save_file`` + ``fsync``);
* the **limits**: device-to-host copy of the model (every copy started at once,
  then waited for), host-to-device copy (``jax.device_put`` of host arrays),
  write + ``fsync`` of the model's bytes to one file, and read of that file into
  64-byte-aligned buffers.

Loads run cold (the checkpoint's pages dropped from the page cache with
``posix_fadvise(DONTNEED)`` after its ``fsync``, no root needed) and then warm
(the cold load read them in). Saves start on a synced disk.

Targets (issue 35), checked by ``--check`` on jaxstruct's built-in formats:

* export <= 1.15x max(device-to-host, write + fsync), measured in the same run;
* export host memory growth <= the host budget (``JAXSTRUCT_HOST_BUDGET``,
  256 MiB) + 5% of the model;
* load <= 1.2x (read + host-to-device), cold against cold and warm against warm;
* ``format="orbax"``: host memory on save and on load <= 1.1x the model, time <=
  orbax's ``StandardCheckpointer``.

On CPU devices the model already lies in host memory (device-to-host and
host-to-device are views), so the accelerator targets are only meaningful on an
accelerator: a claim about accelerators stands only on a GPU run.

Run:  uv run --frozen --all-packages python benchmarks/bench_accel.py [--size 256M] [--check]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from _fresh import run_child  # noqa: E402
from _memory import aligned, reset_peak, status  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
DEFAULT_BUDGET = 256 * MiB

#: label -> (what it is, kind): "ours" sides are jaxstruct, "peer" sides other libraries.
SIDES: dict[str, tuple[str, str]] = {
    "zip": ("`.zip`, default", "ours"),
    "dir": ("directory, default", "ours"),
    "zip-none": ('`.zip`, `compression="none"`', "ours"),
    "dir-none": ('directory, `compression="none"`', "ours"),
    "orbax-format": ('`format="orbax"`', "ours"),
    "safetensors": ("`.safetensors`", "ours"),
    "rawdir": ("docs' minimum format, jaxstruct's checksums (`bench_checksums.py`)", "ours"),
    "rawdir-unchecked": ("the same, no checksums (a measuring device)", "ours"),
    "orbax": ("orbax `StandardCheckpointer`", "peer"),
    "st-flax": ("`safetensors.flax` (+fsync on save)", "peer"),
}
BUILTIN = ("zip", "dir", "zip-none", "dir-none")
LIMITS = ("d2h", "h2d", "write", "read")


def parse_size(text: str) -> int:
    """``"4G"``, ``"256M"``, ``"64K"`` or a number of bytes."""
    found = re.fullmatch(r"\s*([\d.]+)\s*([kmg]?)i?b?\s*", text, re.IGNORECASE)
    if not found:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4G, 256M)")
    scale = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB}[found.group(2).lower()]
    return int(float(found.group(1)) * scale)


def model_shapes(nbytes: int) -> dict[str, tuple[int, ...]]:
    """Layer shapes of a bf16 model of about ``nbytes``: per layer a (d, 3d) projection,
    (d, d), (d, 4d), (4d, d), a (d,) norm and a (4d,) bias."""
    d = (
        4096
        if nbytes >= 2 * GiB
        else 2048
        if nbytes >= 256 * MiB
        else 1024
        if nbytes >= 32 * MiB
        else 256
    )
    layer = 2 * (12 * d * d + 5 * d)
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(max(1, round(nbytes / layer))):
        shapes |= {
            f"l{i:02d}.qkv": (d, 3 * d),
            f"l{i:02d}.out": (d, d),
            f"l{i:02d}.up": (d, 4 * d),
            f"l{i:02d}.down": (4 * d, d),
            f"l{i:02d}.norm": (d,),
            f"l{i:02d}.bias": (4 * d,),
        }
    return shapes


def model_bytes(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(2 * math.prod(s) for s in shapes.values())


# --------------------------------------------------------------------------- child side


def _make_model(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Random-normal bf16 arrays made on the default device (never on the host)."""
    import jax
    import jax.numpy as jnp

    key = jax.random.key(35)
    out = {}
    for i, (name, shape) in enumerate(shapes.items()):
        out[name] = jax.random.normal(jax.random.fold_in(key, i), shape, jnp.bfloat16)
    jax.block_until_ready(out)
    return out


def _target(model: dict[str, Any]) -> dict[str, Any]:
    import jax

    return {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in model.items()
    }


def _fresh_handle(arr: Any) -> Any:
    """A new array object on ``arr``'s buffer: JAX caches host copies on the array object."""
    import jax

    return jax.make_array_from_single_device_arrays(arr.shape, arr.sharding, [arr])


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save(side: str, model: dict[str, Any], path: Path) -> None:
    if side == "orbax":
        import orbax.checkpoint as ocp

        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(path, model)
        checkpointer.wait_until_finished()
        checkpointer.close()
        return
    if side == "st-flax":
        from safetensors.flax import save_file

        save_file(dict(model), str(path))  # (it replaces the dict's values by host copies)
        _fsync_file(path)
        return
    import jaxstruct.io as jio

    if side.startswith("rawdir"):
        with jio.using(_rawdir(side)):
            jio.export(model, path)
    elif side == "orbax-format":
        jio.export(model, path, format="orbax")
    else:
        jio.export(model, path, compression="none" if side.endswith("-none") else "auto")


def _load(side: str, target: dict[str, Any], path: Path) -> Any:
    import jax

    if side == "orbax":
        import orbax.checkpoint as ocp

        checkpointer = ocp.StandardCheckpointer()
        out = checkpointer.restore(path, target)
        checkpointer.close()
    elif side == "st-flax":
        from safetensors.flax import load_file

        loaded = load_file(str(path))
        # safetensors.flax puts arrays on the default device, as the target asks here.
        out = {k: jax.device_put(loaded[k], target[k].sharding) for k in target}
    elif side.startswith("rawdir"):
        import jaxstruct.io as jio

        with jio.using(_rawdir(side)):
            out = jio.load(path, target=target)
    else:
        import jaxstruct.io as jio

        out = jio.load(path, target=target)
    return jax.block_until_ready(out)


def _rawdir(side: str) -> Any:
    """The docs' minimum format of ``bench_checksums.py``: with ``check_members``, its
    arrays checked by jaxstruct's CRC-32s (``rawdir``), or declaring checks it does not
    make (``rawdir-unchecked``: what the same format costs without them)."""
    import bench_checksums

    return bench_checksums._formats()["members" if side == "rawdir" else "unchecked"]


def _path_for(side: str, root: Path, name: str) -> Path:
    suffix = {"zip": ".zip", "zip-none": ".zip", "safetensors": ".safetensors", "st-flax": ".st"}
    suffix.update(dict.fromkeys(("rawdir", "rawdir-unchecked"), ".rawdir"))
    return root / f"{name}{suffix.get(side, '')}"


def _files_of(path: Path) -> list[Path]:
    if path.is_dir():
        return [p for p in path.rglob("*") if p.is_file()]
    return [path] if path.exists() else []


def drop_cache(path: Path) -> None:
    """Evict the (clean, fsynced) pages of ``path``'s files from the page cache."""
    for file in _files_of(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _measure(op: Callable[[], Any]) -> dict[str, float]:
    """Seconds and peak host memory growth of ``op()``; its result lives until measured."""
    import gc

    gc.collect()
    reset_peak()
    base = status("VmRSS")
    t0 = time.perf_counter()
    result = op()
    elapsed = time.perf_counter() - t0
    peak = status("VmHWM") - base
    del result
    return {"seconds": elapsed, "peak": peak}


def _write_bytes(parts: list[Any], path: Path) -> None:
    import numpy as np

    with open(path, "wb", buffering=0) as handle:
        for part in parts:
            view = memoryview(part.reshape(-1).view(np.uint8))
            while view.nbytes:
                view = view[handle.write(view) :]
        os.fsync(handle.fileno())


def _write_like_directory(parts: list[Any], where: Path) -> None:
    import numpy as np
    from jaxstruct.io import _publish

    with open(where / "arrays.npz", "xb", buffering=0) as npz:
        for part in parts:
            view = memoryview(part.reshape(-1).view(np.uint8))
            while view.nbytes:
                view = view[npz.write(view) :]
        with open(where / "manifest.json", "xb", buffering=0) as man:
            man.write(b"{}")
            dirfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
            try:
                _publish.fsync_all([npz.fileno(), man.fileno()], [dirfd])
            finally:
                os.close(dirfd)


def _read_bytes(path: Path, sizes: list[int]) -> list[Any]:
    fd = os.open(path, os.O_RDONLY)
    out, at = [], 0
    try:
        for size in sizes:
            buf = aligned(size)
            view = memoryview(buf)
            done = 0
            while done < size:
                got = os.preadv(fd, [view[done:]], at + done)
                if got <= 0:
                    raise RuntimeError(f"{path}: ended early")
                done += got
            out.append(buf)
            at += size
    finally:
        os.close(fd)
    return out


def _limit(job: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, dict[str, float]]:
    import jax
    import numpy as np

    kind, path = job["side"], Path(job["path"])
    if kind == "read":  # cold (its pages dropped by the parent), then warm
        sizes = [2 * math.prod(s) for s in shapes.values()]
        cold = _measure(lambda: _read_bytes(path, sizes))
        return {"cold": cold, "warm": _measure(lambda: _read_bytes(path, sizes))}
    model = _make_model(shapes)
    hosts = [np.asarray(_fresh_handle(a)) for a in list(model.values())[:1]]  # warm-up
    if kind == "write":
        hosts = [np.asarray(_fresh_handle(a)) for a in model.values()]
        out = {"write": _measure(lambda: _write_bytes(hosts, path))}
        # Issue 35, item 7: the same bytes made durable as the directory format does it
        # (two files, writeback started on both, then they and the directory fsynced at once).
        where = path.with_name("raw-dir")
        where.mkdir()
        out["write-dir"] = _measure(lambda: _write_like_directory(hosts, where))
        shutil.rmtree(where)
        return out

    def d2h() -> list[Any]:
        fresh = [_fresh_handle(a) for a in model.values()]
        for arr in fresh:
            arr.copy_to_host_async()
        return [np.asarray(a) for a in fresh]

    out = {"d2h": _measure(d2h)}
    # h2d: the model's bytes, already in host memory, put on the default device.
    hosts = d2h()
    device = jax.devices()[0]
    jax.block_until_ready(jax.device_put(hosts[-1:], device))  # warm-up
    out["h2d"] = _measure(lambda: jax.block_until_ready(jax.device_put(hosts, device)))
    return out


def _child(job: dict[str, Any]) -> dict[str, Any]:
    import jax

    shapes = {k: tuple(v) for k, v in job["shapes"].items()}
    backend = f"{jax.default_backend()}: {jax.devices()[0].device_kind}"
    if job["side"] in LIMITS:
        return {k: {**v, "backend": backend} for k, v in _limit(job, shapes).items()}
    side, path, warm = job["side"], Path(job["path"]), Path(job["warm"])
    tiny = _make_model(model_shapes(1))
    tiny = {k: tiny[k] for k in list(tiny)[:3]}
    warm_path = _path_for(side, warm, "tiny")
    _save(side, tiny, warm_path)
    if job["op"] == "save":
        model = _make_model(shapes)
        return {**_measure(lambda: _save(side, model, path)), "backend": backend}
    _load(side, _target(tiny), warm_path)
    import jax.numpy as jnp

    target = {
        k: jax.ShapeDtypeStruct(
            s, jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])
        )
        for k, s in shapes.items()
    }
    return {**_measure(lambda: _load(side, target, path)), "backend": backend}


# --------------------------------------------------------------------------- parent side


def _fresh(path: Path) -> Path:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    return path


def measure_all(
    root: Path,
    shapes: dict[str, tuple[int, ...]],
    sides: list[str],
    rounds: int,
    log: Callable[[str], None],
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """``"save:zip"``, ``"load-cold:zip"``, ``"limit:d2h"``... -> one measurement per round;
    and the error of each side that failed."""
    results: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    warm = root / "warm"

    def run(key: str, job: dict[str, Any]) -> Any:
        _fresh(warm)
        warm.mkdir()
        log(key)
        return run_child(HERE, {**job, "warm": str(warm), "shapes": shapes})

    def limits(key: str, job: dict[str, Any]) -> None:
        for name, found in run(key, job).items():
            results.setdefault(f"limit:{name}", []).append(found)

    for r in range(rounds):
        raw = root / "raw.bin"
        limits("limits: device-to-host, host-to-device", {"side": "d2h", "path": str(raw)})
        os.sync()
        limits("limit: write+fsync", {"side": "write", "path": str(raw)})
        drop_cache(raw)
        limits("limit: read (cold, warm)", {"side": "read", "path": str(raw)})
        _fresh(raw)
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        for side in order:
            path = _path_for(side, root, f"ck-{side}")
            _fresh(path)
            os.sync()
            job = {"side": side, "path": str(path)}
            try:  # a side that fails (a peer's version, say) is reported, the others still run
                for key, op in (("save", "save"), ("load-cold", "load"), ("load-warm", "load")):
                    if key == "load-cold":
                        drop_cache(path)
                    found = run(f"{key}:{side}", {**job, "op": op})
                    results.setdefault(f"{key}:{side}", []).append(found)
            except RuntimeError as err:
                errors[side] = str(err).splitlines()[-1]
                log(f"{side} failed: {errors[side]}")
            _fresh(path)
    return results, errors


class Verdict:
    """One target: the measured ratio (median over rounds) against its limit."""

    def __init__(self, what: str, ratios: list[float], limit: float, unit: str = "x") -> None:
        self.what, self.ratios, self.limit, self.unit = what, ratios, limit, unit

    @property
    def ok(self) -> bool:
        return statistics.median(self.ratios) <= self.limit

    def line(self) -> str:
        med = statistics.median(self.ratios)
        spread = f" ({min(self.ratios):.2f}-{max(self.ratios):.2f})" if len(self.ratios) > 1 else ""
        verdict = "met" if self.ok else "**missed**"
        return f"| {self.what} | {med:.2f}{spread} | <= {self.limit:.2f} | {verdict} |"


def report(
    results: dict[str, list[dict[str, Any]]], nbytes: int, sides: list[str], budget: int
) -> tuple[list[str], list[Verdict]]:
    """The Markdown tables (measurements, then targets) and the verdicts."""

    def secs(key: str) -> list[float]:
        return [m["seconds"] for m in results[key]]

    def med(key: str) -> float:
        return statistics.median(secs(key))

    def grow(key: str) -> float:
        return max(m["peak"] for m in results[key])

    gib = nbytes / GiB
    unit, scale = ("GiB", GiB) if nbytes >= GiB else ("MiB", MiB)

    def t(key: str) -> str:
        return f"{med(key):.3g}"

    def mem(key: str) -> str:
        return f"+{grow(key) / scale:.2f} {unit}"

    lines = [
        "| | save (s) | host memory on save | load (s, cold / warm) | host memory on load |",
        "| --- | --- | --- | --- | --- |",
        f"| device-to-host copy (limit) | {t('limit:d2h')} | {mem('limit:d2h')} | | |",
        f"| host-to-device copy (limit) | | | {t('limit:h2d')} | {mem('limit:h2d')} |",
        f"| write+fsync of the bytes (limit) | {t('limit:write')} | | | |",
        f"| the same, made durable as the directory format does | {t('limit:write-dir')} | | | |",
        f"| read of the bytes (limit) | | | {t('limit:cold')} / {t('limit:warm')} | |",
    ]
    for side in sides:
        lines.append(
            f"| {SIDES[side][0]} | {t(f'save:{side}')} | {mem(f'save:{side}')} | "
            f"{t(f'load-cold:{side}')} / {t(f'load-warm:{side}')} | {mem(f'load-warm:{side}')} |"
        )
    verdicts: list[Verdict] = []
    rounds = range(len(results["limit:d2h"]))

    def per_round(key: str) -> list[float]:
        return secs(key)

    d2h, h2d, write = per_round("limit:d2h"), per_round("limit:h2d"), per_round("limit:write")
    for side in [s for s in sides if s in BUILTIN]:
        what = SIDES[side][0]
        save = per_round(f"save:{side}")
        verdicts.append(
            Verdict(
                f"{what}: export / max(d2h, write+fsync)",
                [save[r] / max(d2h[r], write[r]) for r in rounds],
                1.15,
            )
        )
        allowed = budget + 0.05 * nbytes
        verdicts.append(
            Verdict(
                f"{what}: export host growth / (budget + 5% of the model)",
                [m["peak"] / allowed for m in results[f"save:{side}"]],
                1.0,
            )
        )
        for heat in ("cold", "warm"):
            load, read = per_round(f"load-{heat}:{side}"), per_round(f"limit:{heat}")
            verdicts.append(
                Verdict(
                    f"{what}: load ({heat}) / (read + h2d)",
                    [load[r] / (read[r] + h2d[r]) for r in rounds],
                    1.2,
                )
            )
    if "orbax-format" in sides:
        for op in ("save", "load-warm"):
            verdicts.append(
                Verdict(
                    f'`format="orbax"`: {op} host growth / model',
                    [m["peak"] / nbytes for m in results[f"{op}:orbax-format"]],
                    1.1,
                )
            )
        if "orbax" in sides:
            for op in ("save", "load-warm"):
                ours, theirs = per_round(f"{op}:orbax-format"), per_round(f"{op}:orbax")
                verdicts.append(
                    Verdict(
                        f'`format="orbax"`: {op} time / orbax StandardCheckpointer',
                        [ours[r] / theirs[r] for r in rounds],
                        1.0,
                    )
                )
    if "rawdir" in sides and "rawdir-unchecked" in sides:  # issue 45, item 5 (informational)
        lines.append("")
        for op in ("save", "load-warm"):
            ours, bare = per_round(f"{op}:rawdir"), per_round(f"{op}:rawdir-unchecked")
            ratios = [o / b for o, b in zip(ours, bare, strict=True)]
            lines.append(
                f"jaxstruct's checksums on the docs' minimum format, {op}: "
                f"{statistics.median(ratios):.3f}x the same format without them "
                f"({min(ratios):.2f}-{max(ratios):.2f})."
            )
    if "dir-none" in sides and "zip-none" in sides:  # issue 35, item 7 (informational)
        dirs, zips = per_round("save:dir-none"), per_round("save:zip-none")
        lines.append("")
        lines.append(
            f'Directory / `.zip` export, same bytes (`compression="none"`): '
            f"{statistics.median([d / z for d, z in zip(dirs, zips, strict=True)]):.2f}x. "
            f"Model: {gib:.2f} GiB of bf16."
        )
    return lines, verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--size", type=parse_size, default=parse_size("256M"), help="model size (4G, 256M, ...)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="fresh-process rounds per figure")
    parser.add_argument(
        "--sides", nargs="+", choices=list(SIDES), default=list(SIDES), help="what to compare"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--json", type=Path, help="also write every measurement to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    shapes = model_shapes(args.size)
    nbytes = model_bytes(shapes)
    budget = parse_size(os.environ.get("JAXSTRUCT_HOST_BUDGET") or "256M")
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="bench-accel-", dir=os.environ.get("BENCH_DIR")))
    log = lambda key: print(
        f"[bench_accel] {time.perf_counter() - started:6.1f} s  {key}", file=sys.stderr, flush=True
    )
    try:
        results, errors = measure_all(root, shapes, args.sides, args.rounds, log)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    sides = [s for s in args.sides if s not in errors]
    lines, verdicts = report(results, nbytes, sides, budget)
    lines += [f"| {SIDES[s][0]} | failed: {e[:200]} | | | |" for s, e in errors.items()]
    backend = results["limit:d2h"][0]["backend"]
    load = os.getloadavg()
    print(
        f"### Checkpoints on {backend} ({nbytes / GiB:.2f} GiB bf16 in {len(shapes)} arrays, "
        f"{os.cpu_count()} cores, load average {load[0]:.1f} at the end, {args.rounds} round(s), "
        f"{time.perf_counter() - started:.0f} s)\n"
    )
    print("\n".join(lines))
    print("\n| target (issue 35) | ratio | limit | result |\n| --- | --- | --- | --- |")
    for verdict in verdicts:
        print(verdict.line())
    missed = [v for v in verdicts if not v.ok]
    if missed:
        print(f"\n[bench_accel] {len(missed)} target(s) missed", file=sys.stderr)
    return 1 if (missed or errors) and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
