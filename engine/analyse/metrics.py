"""Pure aggregations over the records a run produces: no clocks, no processes, no I/O.

Every function takes plain records (``BatchRecord`` and resource samples, times in seconds since
the run started) so tests can feed exact, hand-made timelines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterable, Mapping, Sequence

from dataloader_tuner.record.rows import BatchRecord, TimedBatch, timed, timed_scale


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_ms(waits_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/max/mean of ``next()`` waits, in milliseconds."""
    if not waits_s:
        return {"p50": None, "p95": None, "max": None, "mean": None}
    ms = [w * 1000.0 for w in waits_s]
    return {
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "max": max(ms),
        "mean": sum(ms) / len(ms),
    }


@dataclass(frozen=True)
class SteadyState:
    start: float  # when the last warm-up batch arrived
    end: float  # when the last measured batch's step ended
    batches: int
    samples: int

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def samples_per_s(self) -> float | None:
        return self.samples / self.seconds if self.seconds > 0 and self.batches else None

    @property
    def batches_per_s(self) -> float | None:
        return self.batches / self.seconds if self.seconds > 0 and self.batches else None


def steady_state(batches: Sequence[BatchRecord], warmup: int) -> SteadyState | None:
    """The measured window after warm-up, or None when the run is too short to have one.

    The window runs from the moment the last warm-up batch was ready to the end of the last
    batch's step, so it counts exactly the batches after warm-up and the time they took.
    """
    if len(batches) <= warmup:
        return None
    first = batches[warmup - 1]
    measured = batches[warmup:]
    last = measured[-1]
    return SteadyState(
        start=first.t_ready + first.step_s,
        end=last.t_ready + last.step_s,
        batches=len(measured),
        samples=sum(b.samples for b in measured),
    )


# Two-sided 95% Student t quantiles by degrees of freedom (blocks - 1), for rate_interval.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
MAX_BLOCKS = 10


def rate_interval(batches: Sequence[BatchRecord], warmup: int, block_batches: int = 1
                  ) -> float | None:
    """The 95% confidence half-width of a steady-state samples/s, as a fraction of it.

    Batch means: the steady batches are cut into up to MAX_BLOCKS consecutive blocks of at least
    ``block_batches`` (the worker count: workers deliver in rounds, so single batches are not
    independent), and the blocks' rates vary as the rate estimate would. None with fewer than
    three blocks: too short to say.
    """
    measured = batches[warmup:]
    if warmup < 1 or not measured:
        return None
    ends = [b.t_ready + b.step_s for b in batches[warmup - 1:]]
    return block_rate_interval([b.samples for b in measured],
                               [ends[i + 1] - ends[i] for i in range(len(measured))],
                               block_batches)


def block_rate_interval(samples: Sequence[int], seconds: Sequence[float],
                        block_batches: int = 1) -> float | None:
    """``rate_interval`` from each steady batch's samples and the time it took (for a loop
    measured batch by batch, such as a watched job's)."""
    return ends_rate_interval(samples, [0.0, *accumulate(seconds)], block_batches)


def ends_rate_interval(samples: Sequence[int], ends: Sequence[float],
                       block_batches: int = 1) -> float | None:
    """``rate_interval`` from each steady batch's samples and when each ended (``ends``: one
    more, the warm-up's end first): O(blocks) but for the sums, which run in C (a trial's
    clock asks while it measures: trial_run.TrialClock)."""
    # Blocks of whole rounds, the last partial round left out: 4 workers sleeping alike, their
    # batches in bursts of 4, read +-19% over 31 batches cut into blocks of 4.4 (some blocks
    # holding 5 batches of one second, others 4) and +-0.1% over 32.
    block = max(block_batches, 1)
    rounds = len(samples) // block
    blocks = min(MAX_BLOCKS, rounds)
    if blocks < 3:
        return None
    size = rounds / blocks
    rates = []
    for i in range(blocks):
        lo, hi = round(i * size) * block, round((i + 1) * size) * block
        elapsed = ends[hi] - ends[lo]
        if elapsed <= 0:
            return None
        rates.append(sum(samples[lo:hi]) / elapsed)
    mean = sum(rates) / blocks
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (blocks - 1))
    return T95.get(blocks - 1, 2.0) * sd / math.sqrt(blocks) / mean if mean > 0 else None


def overlap(start: float, end: float, window_start: float, window_end: float) -> float:
    return max(0.0, min(end, window_end) - max(start, window_start))


def busy_fraction(
    batches: Iterable[BatchRecord], window_start: float, window_end: float,
    counts: Mapping[int, int] | None = None
) -> dict[int, float]:
    """Per worker: the share of the window it spent fetching and collating batches.
    ``counts``: each worker's batches, where ``batches`` are a sample (windows)."""
    span = window_end - window_start
    if span <= 0:
        return {}
    batches = list(batches)
    made = timed(batches)
    scale = timed_scale(batches, made, counts)  # fast batches' making is timed on a sample
    busy: dict[int, float] = {}
    for b in made:
        busy[b.worker_id] = busy.get(b.worker_id, 0.0) + overlap(
            b.fetch_start, b.worker_end, window_start, window_end)
    return {worker: min(total * scale[worker] / span, 1.0)
            for worker, total in sorted(busy.items())}


def busy_timeline(
    batches: Sequence[BatchRecord], end: float, window_s: float = 1.0, start: float = 0.0,
    counts: Mapping[int, int] | None = None
) -> list[dict[str, float]]:
    """Busy fraction per worker in consecutive windows from ``start`` to ``end``: rows of
    {t, worker_id, busy_frac}. ``counts`` as for busy_fraction.

    One pass over the batches (the live view recomputes this every second on long runs).
    """
    n_windows = int(math.ceil((end - start) / window_s)) if end > start else 0
    made = timed(batches)
    scale = timed_scale(batches, made, counts)  # fast batches' making is timed on a sample
    busy: dict[int, list[float]] = {}
    for b in made:
        totals = busy.setdefault(b.worker_id, [0.0] * n_windows)
        lo, hi = max(b.fetch_start, start), min(b.worker_end, end)
        first = max(int((lo - start) // window_s), 0)
        for i in range(first, min(int(math.ceil((hi - start) / window_s)), n_windows)):
            w_lo = start + i * window_s
            totals[i] += overlap(lo, hi, w_lo, w_lo + window_s)
    rows = []
    for i in range(n_windows):
        lo, hi = start + i * window_s, min(start + (i + 1) * window_s, end)
        for worker in sorted(busy):
            rows.append({"t": lo, "worker_id": worker,
                         "busy_frac": min(busy[worker][i] * scale[worker] / (hi - lo), 1.0)
                         if hi > lo else 0.0})
    return rows


def consumer_idle_fraction(batches: Sequence[BatchRecord],
                           steady: SteadyState | None) -> float | None:
    """Share of the steady window the consumer spent waiting in ``next()``."""
    if steady is None or steady.seconds <= 0:
        return None
    waited = sum(
        overlap(b.t_request, b.t_ready, steady.start, steady.end) for b in batches
    )
    return min(waited / steady.seconds, 1.0)


# What the headline's denominator, the loop's time, is (said in results, the CLI and the page)
LOOP_TIME = ("each epoch from its iter() to its last batch's step: waits plus steps; the time "
             "between epochs (validation, checkpoints) in neither")


@dataclass(frozen=True)
class InputWait:
    """The loop's wait for data as the loop lives it: every batch's wait in ``next()`` (an
    epoch's first batch waits from when the epoch was asked for: ``iter()`` starting the
    workers, then their first batch) over the time the loop spent in its epochs (waiting plus
    its steps). Time between epochs (validation, checkpoints) counts as neither, as a loop
    that times its own ``data_time`` and ``batch_time`` (pytorch/examples' imagenet) sees it."""

    waited_s: float
    loop_s: float
    startup_s: tuple[float, ...]  # each epoch's start-up among the batches, in order

    @property
    def share(self) -> float:
        return self.waited_s / self.loop_s if self.loop_s > 0 else 0.0

    @property
    def startup_share(self) -> float:
        return sum(self.startup_s) / self.loop_s if self.loop_s > 0 else 0.0

    def to_dict(self) -> dict[str, float | int | str | None]:
        later = self.startup_s[1:]
        return {
            "share": self.share,
            "loop_is": LOOP_TIME,
            "startup_share": self.startup_share,
            "waited_s": self.waited_s,
            "loop_s": self.loop_s,
            "epochs_started": len(self.startup_s),
            "startup_first_s": self.startup_s[0] if self.startup_s else None,
            "startup_later_median_s": percentile(later, 50),
        }


def input_wait(batches: Sequence[BatchRecord]) -> InputWait | None:
    """The whole run's ``InputWait`` from its rows; None without any."""
    if not batches:
        return None
    waited = sum(b.wait_s for b in batches)
    loop = waited + sum(b.step_s for b in batches)
    return InputWait(waited, loop, tuple(b.wait_s for b in epoch_starts(batches)))


def epoch_starts(batches: Sequence[BatchRecord]) -> list[BatchRecord]:
    """The rows that opened an epoch: their wait is its start-up (the ledger dates an epoch's
    first request from when the epoch was asked for). A list that begins after the run's first
    batch (a long job's recent rows) may begin mid-epoch: its first epoch counts from the next."""
    starts = []
    previous: int | None = None
    for b in batches:
        if b.epoch != previous and (previous is not None or b.seq == 0):
            starts.append(b)
        previous = b.epoch
    return starts


def input_bound_verdict(idle_frac: float | None) -> str | None:
    """TensorBoard's input-pipeline-analyzer thresholds: <5% not, 5-20% moderately, >20% highly."""
    if idle_frac is None:
        return None
    if idle_frac < 0.05:
        return "not input-bound"
    if idle_frac <= 0.20:
        return "moderately input-bound"
    return "highly input-bound"


def per_batch_costs(batches: Sequence[BatchRecord],
                    made: Sequence[TimedBatch] | None = None) -> dict[str, float | None]:
    """Median work per batch inside the workers: what the tuner's cost model starts from.
    ``made``: ``timed(batches)`` where the caller has it already."""
    made = timed(batches) if made is None else made
    if not made:
        return {"fetch_ms": None, "fetch_cpu_ms": None, "collate_ms": None, "bytes": None}
    return {
        "fetch_ms": percentile([b.fetch_s * 1000 for b in made], 50),
        "fetch_cpu_ms": percentile(
            [b.fetch_cpu_s * 1000 for b in made if b.fetch_cpu_s is not None], 50),
        "collate_ms": percentile([b.collate_s * 1000 for b in made], 50),
        "bytes": percentile([b.nbytes for b in made if b.nbytes is not None], 50),
    }
