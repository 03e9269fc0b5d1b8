"""Timing machinery: compiled timeit-style loops, interleaved rounds, ratio statistics.

A *cell* is one operation on one model, timed for several *variants* (one per
implementation, or per size for the scaling check). Every round times each
variant a few times, interleaved, in an order rotated from round to round, so
that drift on a noisy machine (frequency changes, a neighbour process) hits
every variant alike; a round keeps each variant's fastest measurement, because
the noise seen here comes in bursts of milliseconds that only ever add time.
Ratios are taken inside a round, then summarised across rounds by their median
and min-max spread.
"""

from __future__ import annotations

import gc
import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Cell", "CellResult", "Ratio", "Settings", "compile_loop", "run_cell"]

_TEMPLATE = """\
def _make({names}):
    def _loop(_n, _timer=_timer, _repeat=_repeat):
        _t0 = _timer()
        for _ in _repeat(None, _n):
{body}
        return _timer() - _t0
    return _loop
"""


def compile_loop(stmt: str, namespace: Mapping[str, Any]) -> Callable[[int], float]:
    """Return ``loop(n) -> seconds`` running ``stmt`` ``n`` times, as ``timeit`` does.

    The names of ``namespace`` become closure variables of the loop, so ``stmt``
    reads them as fast as locals and no wrapper call is timed along with it.
    """
    names = sorted(namespace)
    body = "\n".join("            " + line for line in stmt.strip("\n").splitlines())
    src = _TEMPLATE.format(names=", ".join(names), body=body)
    scope: dict[str, Any] = {"_timer": time.perf_counter, "_repeat": itertools.repeat}
    exec(compile(src, f"<bench: {stmt.splitlines()[0][:60]}>", "exec"), scope)
    return scope["_make"](**namespace)


@dataclass(frozen=True)
class Settings:
    """How long and how often each variant is timed."""

    rounds: int = 15
    repeats: int = 3  # measurements per variant per round; the round keeps the fastest
    target: float = 0.0025  # seconds per timed measurement
    min_number: int = 1


@dataclass
class Cell:
    """One operation on one model: ``variants`` maps a label to ``(stmt, namespace)``."""

    model: str
    op: str
    variants: dict[str, tuple[str, Mapping[str, Any]]]
    repeats: int | None = None  # overrides Settings.repeats (for cells of long statements)


@dataclass
class CellResult:
    """Per-round, per-iteration seconds of every variant of one cell."""

    model: str
    op: str
    times: dict[str, list[float]] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def median(self, label: str) -> float:
        """Median per-iteration seconds of ``label``."""
        return statistics.median(self.times[label])

    def ratio(self, label: str, base: str) -> Ratio | None:
        """Ratio ``label / base`` per round, or ``None`` when either was not measured."""
        if label not in self.times or base not in self.times:
            return None
        return Ratio.of([t / b for t, b in zip(self.times[label], self.times[base], strict=True)])


@dataclass(frozen=True)
class Ratio:
    """Median and spread of per-round ratios."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Ratio:
        """Summarise per-round ratios."""
        return cls(statistics.median(values), min(values), max(values))

    def scaled(self, by: float) -> Ratio:
        """Return this ratio divided by ``by`` (e.g. the same ratio on another model)."""
        return Ratio(self.median / by, self.low / by, self.high / by)

    def __format__(self, spec: str) -> str:
        return f"{self.median:.2f} ({self.low:.2f}-{self.high:.2f})"


def _calibrate(loop: Callable[[int], float], settings: Settings) -> int:
    """Return how many iterations make one measurement last about ``settings.target``."""
    # The first call pays for lazily generated code and cold caches; an estimate
    # taken from it would make every later measurement far too short.
    loop(1)
    number = 1
    while True:
        # Best of three: a burst of noise during calibration must not shrink the count.
        elapsed = min(loop(number) for _ in range(3))
        if elapsed >= settings.target / 5 or number >= 1 << 24:
            break
        number *= 10 if elapsed < settings.target / 100 else 2
    per_iter = elapsed / number
    return max(settings.min_number, math.ceil(settings.target / per_iter))


def run_cell(cell: Cell, settings: Settings) -> CellResult:
    """Time every variant of ``cell`` in interleaved, rotated rounds.

    A variant whose statement raises is recorded in ``errors`` and left out, so
    one broken peer never hides the others' numbers.
    """
    result = CellResult(cell.model, cell.op)
    loops: dict[str, Callable[[int], float]] = {}
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: collections would land on whichever variant is unlucky
    try:
        for label, (stmt, ns) in cell.variants.items():
            try:
                loop = compile_loop(stmt, ns)
                result.numbers[label] = _calibrate(loop, settings)
            except Exception as err:
                result.errors[label] = f"{type(err).__name__}: {err}"
                continue
            loops[label] = loop
            result.times[label] = []
        labels = list(loops)
        for r in range(settings.rounds):
            shift = r % len(labels) if labels else 0
            order = labels[shift:] + labels[:shift]
            best = dict.fromkeys(order, math.inf)
            for _ in range(cell.repeats or settings.repeats):
                for label in order:
                    number = result.numbers[label]
                    best[label] = min(best[label], loops[label](number) / number)
            for label in order:
                result.times[label].append(best[label])
            gc.collect()  # outside timed regions; class definitions leave cycles behind
    finally:
        if gc_was_enabled:
            gc.enable()
    return result
