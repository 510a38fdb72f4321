"""How long an in-place search takes: the time it says once its first setting is measured and
again once the loop's wait has named the count to measure (tune/in_place.py), held against the
time it took when it chooses.

NOTE [ The time an in-place search says ]

    A search in a running job is timed by the job's own batches, so nothing is known before
    its first setting is measured. That trial (or the first with workers, once measured) is
    read as the prediction reads it (NOTE [ The count the wait predicts ], tune/in_place.py):
    a step of c - w, and workers that each make a batch in n * c (without workers, in the
    wait w), so k workers hand a batch every max(step, make / k), k counted up to the cores.
    Each setting left then costs its workers' start (as measured), its warm-up batches, and
    its steady batches at that pace, as many as the measured trials needed to know their
    rates (the median; one judged at its cap short of TARGET_CI needed more:
    Trial.batches_to_know), up to the trial's time cap (``trial_cap_s``). Trials with workers
    are read apart from those without: their batches come in bursts, so their rates take
    more batches to know (CPU-bound samples on 2 cores: 20 batches at 0 workers, 167-256 and
    the 4 s cap at 1-4); until one is measured, they run to their cap. The settings left
    are those queued (the predicted count and its neighbours), or where nothing is predicted
    yet 1 worker and the count this trial predicts and its neighbours; 0 workers where the job
    has workers (always measured); and, at even odds, one step of the climb past them; each
    trial with workers a quarter longer for the close calls measured on. A climb that keeps
    paying takes longer than said; the choice's line says by how much.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Callable
from dataclasses import dataclass

from dataloader_tuner.config import warmup_batches
from dataloader_tuner.tune.in_place_trial import LoopModel, trial_cap_s
from dataloader_tuner.tune.trial_rules import MIN_STEADY_BATCHES

# A step of the climb past the counts queued: taken where the highest (or the lowest) pays,
# about every other search (the simulated searches of tests/test_inplace.py).
CLIMB_STEP_ODDS = 0.5
# A trial with workers measured on, its gain within the noise (in_place.py's close calls): as
# much again, about one trial in four where counts past the cores measure alike.
CLOSE_CALL_ODDS = 0.25

@dataclass
class SearchTime:
    """The search's own time: when it began, what it said, what it took."""

    measuring_from: float | None = None  # PREWARM_S after the job's first batch
    began: float | None = None  # its first measured batch
    announced_s: float | None = None  # its whole time, as first said
    estimated_s: float | None = None  # as last said
    took_s: float | None = None  # once it chose

    def begin(self, now: float) -> None:
        if self.began is None:
            self.began = now

    def elapsed(self, now: float) -> float:
        return now - (self.began if self.began is not None else now)

    def said(self, estimate_s: float) -> None:
        self.estimated_s = estimate_s
        if self.announced_s is None:
            self.announced_s = estimate_s


def counts_left(queued: Sequence[int], predicted: bool, zero_measured: bool, model: LoopModel
                ) -> list[tuple[int, float]]:
    """The worker counts the search will likely still measure, each with the odds it does
    (see the NOTE)."""
    counts = list(queued)
    if not predicted:
        fed = model.fed_by()
        for n in (1, fed, fed + 1, fed - 1):
            if n > 0 and n not in counts:
                counts.append(n)
    if not zero_measured and 0 not in counts:
        counts.append(0)
    climb = [(max(counts) + 1, CLIMB_STEP_ODDS)] if counts else []
    return [(n, 1.0) for n in counts] + climb


def seconds_left(counts: Sequence[tuple[int, float]], model: LoopModel,
                 steady_batches: Callable[[int], float | None], startup_s: float,
                 prefetch: int) -> float:
    """The time to measure ``counts`` at their odds (see the NOTE), each for
    ``steady_batches(workers)`` (None: as many as fit) up to its cap."""
    total = 0.0
    for n, odds in counts:
        cycle, warmup = model.cycle_s(n), warmup_batches(n, prefetch if n else 0)
        cap, batches = trial_cap_s(cycle, warmup, MIN_STEADY_BATCHES), steady_batches(n)
        steady = cap if batches is None else min(batches * cycle, cap)
        trial = (startup_s if n else 0.0) + warmup * cycle + steady
        total += odds * trial * (1 + (CLOSE_CALL_ODDS if n else 0.0))
    return total


def announcement(elapsed_s: float, left_s: float, settings: int) -> str:
    """The estimate, as a decision line adds it."""
    return (f"; the search needs ~{_seconds(left_s)} more ({settings} setting(s) left, "
            f"~{_seconds(elapsed_s + left_s)} in all)")


def accounting(time: SearchTime) -> str:
    """The time the search took, against what it said first and, where it said more, last."""
    took_s, first, last = time.took_s or 0.0, time.announced_s, time.estimated_s
    said = f", said ~{_seconds(first)}" if first else ""
    if first and last and abs(last / first - 1) >= 0.1:
        said += f" then ~{_seconds(last)}"
    return f" after {_seconds(took_s)}{said}"


def median_or(values: Sequence[float], default: float) -> float:
    return statistics.median(values) if values else default


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
