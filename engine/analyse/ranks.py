"""A distributed job's ranks side by side, and which one holds the others back.

Every rank waits for the slowest at the next collective, so the job runs at the pace of its
slowest rank. From each rank's own watched run: its rate, its input wait (the share of its loop
spent in ``next()``) and its step; the slowest rank is named when it is clearly slower than the
median (beyond SLOWER_THAN_MEDIAN), with the cause its own numbers show: a starved loader (its
input wait well above the others') or slower steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from engine.analyse import metrics
from engine.analyse.metrics import BatchRecord

SLOWER_THAN_MEDIAN = 0.05  # a rank this much below the median rate is named
STARVED_MARGIN = 0.10  # input wait this much above the others' median: the loader is the cause


@dataclass(frozen=True)
class RankFigures:
    rank: int
    node: int
    samples_per_s: float | None
    input_wait_frac: float | None  # share of the loop's time spent waiting in next()
    step_ms: float | None  # median step


def rank_figures(rank: int, node: int, batches: Sequence[BatchRecord],
                 warmup: int = 1) -> RankFigures:
    steady = metrics.steady_state(list(batches), warmup)
    measured = list(batches)[warmup:]
    idle = metrics.consumer_idle_fraction(list(batches), steady) if steady else None
    return RankFigures(rank, node, steady.samples_per_s if steady else None, idle,
                       metrics.percentile([b.step_s * 1000 for b in measured], 50)
                       if measured else None)


def slowest_rank(figures: Sequence[RankFigures]) -> tuple[int, str] | None:
    """(rank, why) when one rank is clearly the slowest, else None."""
    rated = [f for f in figures if f.samples_per_s]
    if len(rated) < 2:
        return None
    median = statistics.median(f.samples_per_s for f in rated)
    slowest = min(rated, key=lambda f: f.samples_per_s)
    if slowest.samples_per_s > (1 - SLOWER_THAN_MEDIAN) * median:
        return None
    others = [f for f in rated if f is not slowest]
    pace = (f"{slowest.samples_per_s:.0f} samples/s against a median of {median:.0f}: every "
            "rank waits for it at each collective")
    waits = [f.input_wait_frac for f in others if f.input_wait_frac is not None]
    if slowest.input_wait_frac is not None and waits:
        typical = statistics.median(waits)
        if slowest.input_wait_frac > typical + STARVED_MARGIN:
            return slowest.rank, (f"rank {slowest.rank} is starved for data: it waits for "
                                  f"batches {slowest.input_wait_frac:.0%} of its time against "
                                  f"{typical:.0%} on the other ranks ({pace}). Its loader (or "
                                  f"node {slowest.node}'s CPUs) is the bottleneck.")
    steps = [f.step_ms for f in others if f.step_ms is not None]
    if slowest.step_ms is not None and steps:
        return slowest.rank, (f"rank {slowest.rank}'s steps are slower: {slowest.step_ms:.1f} "
                              f"ms against {statistics.median(steps):.1f} ms on the other ranks "
                              f"({pace}); its input wait is like theirs.")
    return slowest.rank, f"rank {slowest.rank} is the slowest ({pace})."
