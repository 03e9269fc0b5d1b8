"""Cost of the debugging aids: ``explain_recompiles`` against plain jitted dispatch.

    uv run --frozen --all-packages python benchmarks/bench_debug.py [--quick] [--check]

First the wrapper's own cost per call is measured around a no-op stand-in
(wrapped minus bare). Then each row times a warmed-up ``jax.jit`` function on
a struct (nothing recompiles), bare and wrapped, interleaved in the same
rounds. The target (the wrapper adds at most 10% to a dispatch) is judged on
that cost over the row's dispatch time, because the directly measured ratio
of two ~10 us calls swings by more than 10% on a busy machine; it is shown
too.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
from _harness import Cell, Settings, run_cell
from _models import load_impls

__all__ = ["main"]

LIMIT = 1.10  # explain_recompiles(f)(x) <= 1.10x f(x): the wrapper adds at most 10%


def _models() -> dict[str, Any]:
    """The flat and nested models of the core benchmark (``_models.py``), built."""
    impls, failures = load_impls(["jaxstruct"])
    if not impls:
        raise SystemExit(f"jaxstruct models did not load: {failures}")
    flat_cls, nested_cls = impls[0].ns["S"], impls[0].ns["N"]

    def flat() -> Any:
        return flat_cls(*(jnp.full(3, float(i)) for i in range(4)))

    return {"flat": flat(), "nested": nested_cls(flat(), flat(), flat(), flat())}


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
    # The wrapper's own cost, measured around a stand-in with a dispatch cache
    # that never grows: two cheap Python calls, stable even on a busy machine.
    stub = _Stub()
    watched_stub = js.explain_recompiles(stub, on_recompile=lambda r: None)
    flat = _models()["flat"]
    variants = {
        "bare": ("f(obj)", {"f": stub, "obj": flat}),
        "explain": ("f(obj)", {"f": watched_stub, "obj": flat}),
    }
    stubbed = run_cell(Cell("flat", "stub", variants), settings)
    cost = max(stubbed.median("explain") - stubbed.median("bare"), 0.0)
    print("### explain_recompiles overhead against plain jitted dispatch\n")
    print(f"Wrapper cost per call (wrapped minus bare no-op stand-in): {cost * 1e9:.0f} ns\n")
    print("| model | jit dispatch | explain / jit, measured | wrapper cost / jit | target | ok |")
    print("| --- | --- | --- | --- | --- | --- |")
    missed = False
    for model, obj in _models().items():
        # The same jitted function, bare and wrapped: only the wrapper differs.
        plain = jax.jit(lambda s: s)
        watched = js.explain_recompiles(plain, on_recompile=lambda r: None)
        for f in (plain, watched):
            jax.block_until_ready(f(obj))
            jax.block_until_ready(f(obj))
        variants = {
            "jit": ("f(obj)", {"f": plain, "obj": obj}),
            "explain": ("f(obj)", {"f": watched, "obj": obj}),
        }
        result = run_cell(Cell(model, "dispatch", variants), settings)
        ratio = result.ratio("explain", "jit")
        assert ratio is not None, result.errors
        # The target is judged on the stand-in cost over this run's dispatch
        # time; the direct ratio is shown too but swings with the machine's load.
        share = cost / result.median("jit")
        ok = share <= LIMIT - 1
        missed |= not ok
        print(
            f"| {model} | {_fmt(result.median('jit'))} | {ratio} | {share:.3f} "
            f"| <= {LIMIT - 1:.2f} | {'yes' if ok else 'NO'} |"
        )
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
