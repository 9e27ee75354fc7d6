"""Wall-clock timing of a callable: the one helper the benchmarks and the auto policy share."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timings(fn: Callable[[], object], repeats: int, warmup: int = 0) -> list[float]:
    """Wall seconds of each of ``repeats`` calls of ``fn``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 0) -> float:
    """The median of :func:`timings`."""
    return statistics.median(timings(fn, repeats, warmup))
