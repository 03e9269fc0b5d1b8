"""Cost of the debugging aids: ``explain_recompiles`` against plain jitted dispatch.

    uv run --frozen --all-packages python benchmarks/bench_debug.py [--quick] [--check]

Each row times calling a warmed-up ``jax.jit`` function on a struct (nothing
recompiles), bare and wrapped in ``js.explain_recompiles``, interleaved in the
same rounds; the ratio is wrapped / bare. The target keeps the wrapper cheap
enough to leave on in a debug run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
from _harness import Cell, Settings, run_cell

__all__ = ["main"]

LIMIT = 1.10  # explain_recompiles(f)(x) <= 1.10x f(x)


class Flat(js.Struct):
    a: Any
    b: Any
    c: Any
    d: Any
    step: int = js.field(static=True, default=0)
    tag: str = js.field(static=True, default="run")


class Nested(js.Struct):
    p: Flat
    q: Flat
    r: Flat
    s: Flat


def _models() -> dict[str, Any]:
    def flat() -> Flat:
        return Flat(*(jnp.full(3, float(i)) for i in range(4)))

    return {"flat": flat(), "nested": Nested(flat(), flat(), flat(), flat())}


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} us"


def main(argv: list[str]) -> int:
    """Time both variants per model, print a Markdown table; with --check, fail on a miss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds of 2 ms: a smoke run")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    settings = (
        Settings(rounds=5, repeats=2, target=0.002)
        if args.quick
        else Settings(rounds=args.rounds, repeats=3, target=0.0025)
    )
    print("### explain_recompiles overhead (ratio to plain jitted dispatch)\n")
    print("| model | jit dispatch | explain_recompiles / jit | difference | target | ok |")
    print("| --- | --- | --- | --- | --- | --- |")
    missed = False
    for model, obj in _models().items():
        plain = jax.jit(lambda s: s)
        watched = js.explain_recompiles(jax.jit(lambda s: s), on_recompile=lambda r: None)
        for f in (plain, watched):
            jax.block_until_ready(f(obj))
            jax.block_until_ready(f(obj))
        cell = Cell(
            model,
            "dispatch",
            {
                "jit": ("f(obj)", {"f": plain, "obj": obj}),
                "explain": ("f(obj)", {"f": watched, "obj": obj}),
            },
        )
        result = run_cell(cell, settings)
        ratio = result.ratio("explain", "jit")
        assert ratio is not None, result.errors
        ok = ratio.median <= LIMIT
        missed |= not ok
        extra = result.median("explain") - result.median("jit")
        print(
            f"| {model} | {_fmt(result.median('jit'))} | {ratio} | {extra * 1e9:+.0f} ns "
            f"| <= {LIMIT:.2f} | {'yes' if ok else 'NO'} |"
        )
    # The wrapper's own cost, without JAX's dispatch noise around it: a stand-in
    # with a dispatch cache that never grows.
    stub = _Stub()
    watched_stub = js.explain_recompiles(stub, on_recompile=lambda r: None)
    obj = _models()["flat"]
    result = run_cell(
        Cell(
            "flat",
            "stub",
            {
                "bare": ("f(obj)", {"f": stub, "obj": obj}),
                "explain": ("f(obj)", {"f": watched_stub, "obj": obj}),
            },
        ),
        settings,
    )
    extra = result.median("explain") - result.median("bare")
    print(f"\nWrapper cost per call (against a no-op stand-in): {extra * 1e9:.0f} ns")
    return 1 if (missed and args.check) else 0


class _Stub:
    """A callable shaped like a jitted function whose cache never grows."""

    __name__ = __qualname__ = "stub"

    def __call__(self, obj: Any) -> Any:
        return obj

    def _cache_size(self) -> int:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
