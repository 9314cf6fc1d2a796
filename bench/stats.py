"""The benchmarks' statistics, one definition each: percentiles of a run's samples (latencies),
medians of a few rounds' figures, ratios. Every bench/ script takes its figures from here.

Percentiles are the sorted samples' value at index floor(q * n), the last one for q = 1 (so
"max" is percentile 1.0): the smallest sample with more than q * n samples at or below it, never
an interpolation, so every figure reported is a latency that was measured. It is what the four
benchmarks each computed with a helper of their own (bench/jobs.py, bench/gateway.py,
bench/cluster.py, bench/idempotency.py), so no reported figure changed definition when they
moved here. It differs from the textbook nearest rank (index ceil(q * n) - 1) only when q * n is a
whole number, by one rank up: with 100 samples p99 is the largest.

Medians of rounds (requests/s, jobs/s, ratios of a round) are statistics.median: the mean of the
two middle values when the count is even; a handful of round figures, not a distribution.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from fractions import Fraction

median = statistics.median


def percentile(values: Iterable[float], q: float) -> float:
    """The value at index floor(q * n) of the sorted values (the last for q = 1); nan if none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def point(name: str) -> float:
    """ "p50" -> 0.5, "p99.9" -> 0.999, "max" -> 1.0."""
    return 1.0 if name == "max" else float(Fraction(name.removeprefix("p")) / 100)


def percentiles(values: Iterable[float], *names: str, digits: int | None = None) -> dict[str, float]:
    """Named percentiles of the values ("p50", "p99.9", "max"), rounded to `digits` if given."""
    ordered = sorted(values)
    found = {name: percentile(ordered, point(name)) for name in names}
    return found if digits is None else {name: round(v, digits) for name, v in found.items()}


def ratio(a: float, b: float, default: float = 0.0) -> float:
    """a / b, or `default` when b is 0 (a baseline that did nothing)."""
    return a / b if b else default


def median_ratio(a: Iterable[float], b: Iterable[float]) -> float:
    """The median over rounds of a / b within each round (pairs of figures measured side by side)."""
    return median(ratio(x, y) for x, y in zip(a, b))
