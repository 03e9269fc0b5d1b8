"""Cost of a ``replace`` a ported root class defines itself, against the struct's own.

    uv run --frozen --all-packages python benchmarks/bench_replace_override.py [--rounds N]

A flax.struct library ported to jaxstruct (docs/coming-from.md) may have a
root class that defines ``replace()`` calling ``dataclasses.replace``: under
``@flax.struct.dataclass`` the decorator overwrote it, after the port it
shadows the struct's own ``replace`` in every subclass. Each row times
``state.replace(mean=..., generation=...)`` on a subclass of such a root
(an evolution-strategy state: five array fields and a static one), for the
flax.struct original and three ports: the root's ``replace`` dropped (the
struct's own), kept as it was (``dataclasses.replace``), and kept as a
wrapper around ``super().replace``. Times are per call; ratios are to flax.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import jaxstruct.core as js
from _harness import Cell, Settings, run_cell

__all__ = ["main"]


def _flax_state() -> Any:
    from flax import struct

    @struct.dataclass
    class State:
        mean: Any
        sigma: Any
        best_member: Any
        best_fitness: Any
        generation: Any
        popsize: int = struct.field(pytree_node=False, default=16)

        def replace(self, **changes: Any) -> Any:  # overwritten by the decorator
            return dataclasses.replace(self, **changes)

    @struct.dataclass
    class EsState(State):
        pass

    return EsState


def _ported(kind: str | None) -> Any:
    """The ported root (with ``replace`` kept as written, or none) and its subclass."""

    class State(js.Struct):
        mean: Any
        sigma: Any
        best_member: Any
        best_fitness: Any
        generation: Any
        popsize: int = js.field(static=True, default=16)

        if kind == "dataclasses":

            def replace(self, **changes: Any) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
                return dataclasses.replace(self, **changes)

        elif kind == "super":

            def replace(self, **changes: Any) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
                return super().replace(**changes)

    class EsState(State):
        pass

    return EsState


VARIANTS = {
    "flax.struct (decorator's replace)": _flax_state,
    "port, root replace dropped (struct's own)": lambda: _ported(None),
    "port, root replace kept (dataclasses.replace)": lambda: _ported("dataclasses"),
    "port, root replace kept (super().replace)": lambda: _ported("super"),
}


def main(argv: list[str]) -> int:
    """Time every variant in interleaved rounds and print a Markdown table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    settings = Settings(rounds=args.rounds, repeats=3, target=0.0025)
    variants: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for label, make in VARIANTS.items():
        cls = make()
        state = cls(
            jnp.zeros(10), jnp.ones(10), jnp.zeros(10), jnp.zeros(()), jnp.zeros((), jnp.int32)
        )
        namespace = {"s": state, "m": jnp.ones(10), "g": jnp.ones((), jnp.int32)}
        variants[label] = ("s.replace(mean=m, generation=g)", namespace)
    result = run_cell(Cell("es-state", "replace", variants), settings)
    if result.errors:
        print(f"errors: {result.errors}", file=sys.stderr)
        return 1
    base = next(iter(VARIANTS))
    print("### replace on a subclass of a ported root class\n")
    print("| variant | time per call | / flax.struct (median, min-max over rounds) |")
    print("| --- | --- | --- |")
    for label in VARIANTS:
        ratio = result.ratio(label, base)
        print(f"| {label} | {result.median(label) * 1e6:.2f} us | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
