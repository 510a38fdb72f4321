"""A run's batches as recorded: rows, and where batches came too fast, windows (NOTE [ Windows
for fast loaders ], record/windows.py). The figures a result shows read from here: with no
windows each is exactly metrics' over the rows; with windows the counts, samples and summed
times come from the windows and the rows they cover are a sample kept for the charts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from dataloader_tuner.analyse import metrics
from dataloader_tuner.record.rows import BatchRecord, timed, timed_scale
from dataloader_tuner.record.windows import (KEEP_EVERY, WINDOW_ABOVE_PER_S, WINDOW_S,
                                             BatchWindow, bucket_middle, even_sample, holders,
                                             wait_buckets)


@dataclass(frozen=True)
class BatchLog:
    rows: Sequence[BatchRecord]
    windows: Sequence[BatchWindow] = ()
    # rows no window covers (every row where there are no windows)
    loose: list[BatchRecord] = field(init=False)
    # the window holding each row's batch, or None (windows.holders)
    holding: list[int | None] = field(init=False)

    def __post_init__(self) -> None:
        # a snapshot: a live run's reader thread goes on appending to the lists given
        object.__setattr__(self, "rows", tuple(self.rows))
        object.__setattr__(self, "windows", tuple(self.windows))
        object.__setattr__(self, "holding", holders(self.rows, self.windows))
        object.__setattr__(self, "loose", [row for row, held in zip(self.rows, self.holding)
                                           if held is None])

    @property
    def batches(self) -> int:
        return len(self.loose) + sum(w.batches for w in self.windows)

    def steady_state(self, warmup: int) -> metrics.SteadyState | None:
        """metrics.steady_state, the windows' batches counted (warm-up rows are never folded:
        Thinner's ``loose_below``)."""
        if not self.windows:
            return metrics.steady_state(self.rows, warmup)
        if self.batches <= warmup or len(self.loose) < warmup:
            return None
        first = self.loose[warmup - 1]
        ends = [w.t_end for w in self.windows[-1:]] + [
            b.t_ready + b.step_s for b in self.loose[-1:]]
        return metrics.SteadyState(
            start=first.t_ready + first.step_s, end=max(ends),
            batches=self.batches - warmup,
            samples=(sum(b.samples for b in self.loose[warmup:])
                     + sum(w.samples for w in self.windows)))

    def idle_fraction(self, steady: metrics.SteadyState | None) -> float | None:
        """metrics.consumer_idle_fraction, the windows' waits counted (they lie in the steady
        window: they begin after the warm-up)."""
        if not self.windows:
            return metrics.consumer_idle_fraction(self.rows, steady)
        if steady is None or steady.seconds <= 0:
            return None
        waited = sum(metrics.overlap(b.t_request, b.t_ready, steady.start, steady.end)
                     for b in self.loose) + sum(w.wait_s for w in self.windows)
        return min(waited / steady.seconds, 1.0)

    def input_wait(self) -> metrics.InputWait | None:
        """metrics.input_wait, the windows' sums counted; each epoch's first batch is a row."""
        if not self.windows:
            return metrics.input_wait(self.rows)
        waited = sum(b.wait_s for b in self.loose) + sum(w.wait_s for w in self.windows)
        loop = waited + sum(b.step_s for b in self.loose) + sum(w.step_s for w in self.windows)
        return metrics.InputWait(waited, loop,
                                 tuple(b.wait_s for b in metrics.epoch_starts(self.rows)))

    def latency_ms(self, warmup: int) -> dict[str, float | None]:
        """metrics.latency_ms of the batches after the warm-up; where windows hold some, the
        percentiles from their histograms (within a bucket), the max and mean exact."""
        if not self.windows:
            return metrics.latency_ms([b.wait_s for b in self.rows[warmup:]])
        waits = [b.wait_s for b in self.loose[warmup:]]
        hist = Counter(wait_buckets(waits))
        for window in self.windows:
            for bucket, count in window.wait_hist:
                hist[bucket] += count
        n = sum(hist.values())
        most = max([*waits, *(w.wait_max_s for w in self.windows)])
        total = sum(waits) + sum(w.wait_s for w in self.windows)
        return {"p50": 1000 * min(hist_percentile(hist, 50), most),
                "p95": 1000 * min(hist_percentile(hist, 95), most),
                "max": 1000 * most, "mean": 1000 * total / n}

    def windowed(self) -> dict[str, float | int | None] | None:
        """How the rows were kept where windows hold batches (None: one row per batch): the
        rate inside the windows, the window's length, every how many a row was kept."""
        if not self.windows:
            return None
        span = sum(w.t_end - w.t_start for w in self.windows)
        inside = sum(w.batches for w in self.windows)
        return {"from_batches_per_s": round(inside / span, 1) if span > 0 else None,
                "above_batches_per_s": WINDOW_ABOVE_PER_S, "window_s": WINDOW_S,
                "keep_every": KEEP_EVERY, "windows": len(self.windows),
                "rows_kept": len(self.rows)}

    def even_rows(self) -> list[BatchRecord]:
        """The rows as an even sample of the batches, for a chart over time: every row where
        there are no windows, else the loose ones and those kept as a sample inside windows
        (not those kept for another reason: each epoch's first would over-weigh start-ups)."""
        return [row for row, _ in self.weighted()]

    def weighted(self) -> list[tuple[BatchRecord, float]]:
        """``even_rows``, each with the batches it stands for: 1 a loose row, a window's
        batches over its rows in the sample for one inside it."""
        if not self.windows:
            return [(row, 1.0) for row in self.rows]
        kept = even_sample(self.rows, self.holding)
        picked = [b for b, k in zip(self.rows, kept) if k]
        where = [w for w, k in zip(self.holding, kept) if k]
        inside = Counter(w for w in where if w is not None)  # window -> its rows in the sample
        return [(row, 1.0 if w is None else self.windows[w].batches / inside[w])
                for row, w in zip(picked, where)]

    def median(self, value: Callable[[BatchRecord], float | None], warmup: int = 0
               ) -> float | None:
        """The median of ``value`` over the batches after the warm-up, each row of the even
        sample weighing the batches it stands for (rows where it is None left out)."""
        pairs = sorted((v, w) for row, w in self.weighted()[warmup:]
                       if (v := value(row)) is not None)
        if not self.windows:
            return metrics.percentile([v for v, _ in pairs], 50)
        half, seen = sum(w for _, w in pairs) / 2, 0.0
        for v, w in pairs:
            seen += w
            if seen >= half:
                return v
        return None

    def gpu_gaps_ms(self, warmup: int = 0) -> tuple[list[float], float, float] | None:
        """The GPU's idle gaps after the warm-up: the even sample's (for percentiles), their
        exact sum and the largest; None where none was timed."""
        sample = [row.gpu_gap_ms for row in self.even_rows()[warmup:]
                  if row.gpu_gap_ms is not None]
        loose = [b.gpu_gap_ms for b in self.loose[warmup:] if b.gpu_gap_ms is not None]
        if not sample and not any(w.gaps for w in self.windows):
            return None
        return (sample, sum(loose) + sum(w.gap_ms for w in self.windows),
                max([*loose, *(w.gap_max_ms for w in self.windows if w.gaps)]))

    def wait_counts(self, warmup: int) -> tuple[list[float], list[int]]:
        """Every batch's wait after the warm-up, as (seconds, how many batches waited that
        long): the rows' own, and the windows' histogram buckets at their middles (~9% wide)."""
        rows = self.loose if self.windows else list(self.rows)
        waits = [b.wait_s for b in rows[warmup:]]
        counts = [1] * len(waits)
        for window in self.windows:
            for bucket, count in window.wait_hist:
                waits.append(bucket_middle(bucket))
                counts.append(count)
        return waits, counts

    def arrivals(self) -> list[tuple[float, float, int]]:
        """(from, to, samples) of each loose batch (when it arrived: from is to) and each window
        (its span): what a throughput chart bins."""
        return ([(b.t_ready, b.t_ready, b.samples) for b in self.loose]
                + [(w.t_start, w.t_end, w.samples) for w in self.windows])

    def worker_batches(self) -> dict[int, int]:
        """Batches per worker id (-1: the main process), all counted."""
        counts: dict[int, int] = {}
        for b in self.loose:
            counts[b.worker_id] = counts.get(b.worker_id, 0) + 1
        for window in self.windows:
            for worker, n in window.workers:
                counts[worker] = counts.get(worker, 0) + n
        return counts


def hist_percentile(hist: Mapping[int, int], q: float) -> float:
    """The q-th percentile (seconds) of the waits a histogram counts: the middle of the bucket
    that holds it, so within one bucket."""
    rank = (sum(hist.values()) - 1) * q / 100.0
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen > rank:
            return bucket_middle(bucket)
    return bucket_middle(max(hist))


def window_figures(batches: Sequence[BatchRecord], warmup: int = 1,
                   windows: Sequence[BatchWindow] = ()) -> dict[str, float | None]:
    """samples/s, input wait and median step over ``batches`` (a rank's recent ones, with the
    ``windows`` among them where batches came fast: record/windows.latest_stretch), and how
    busy the workers that made them were."""
    batches = list(batches)
    log = BatchLog(batches, windows)
    steady = log.steady_state(warmup)
    measured = batches[warmup:]
    busy: float | None = None
    workers = {b.worker_id for b in measured if b.worker_id >= 0}
    made = timed(measured)
    wait = log.input_wait()
    if steady is not None and workers and made and steady.seconds > 0:
        # fast batches' making is timed on a sample
        scale = timed_scale(measured, made, log.worker_batches() if windows else None)
        making = sum(b.making_s * scale[b.worker_id] for b in made)
        busy = min(1.0, making / (steady.seconds * len(workers)))
    return {
        "samples_per_s": steady.samples_per_s if steady else None,
        # As the loop lived it: epoch start-ups among these batches included
        "input_wait_frac": wait.share if wait is not None and wait.loop_s > 0 else None,
        # (each kept row weighing the batches it stands for, where rows are kept in windows)
        "step_ms": log.median(lambda b: b.step_s * 1000, warmup) if measured else None,
        "worker_busy_frac": busy,
    }
