"""Batches kept in windows where they come too fast to keep one row each.

NOTE [ Windows for fast loaders ]

    A loader making 8,000 batches a second (tests/real/long_tail.py at 0 workers) made 8,000
    rows a second: 480k rows held by the dashboard's process and written to the run history
    for one minute's profile, and as many read back to draw a chart of a few hundred points.
    Beyond WINDOW_ABOVE_PER_S the rows are folded into windows of WINDOW_S: a window keeps its
    batches' count, samples, summed and largest wait and step, each worker's count, and a
    histogram of the waits (log-spaced buckets, HISTOGRAM_PER_DOUBLING a doubling: each ~9%
    wide) from which the latency percentiles are read, and the GPU's idle gaps where timed
    (count, sum, largest). The batches whose making was timed stay whole rows (the workers'
    busy shares and per-batch costs are read from those, scaled by the windows' counts; a
    fast batch's making is timed on one in probes.TIME_EVERY of each process's, KEEP_EVERY's
    rate), and they are a window's even sample for the charts and the medians of steps and
    copies; a window with none timed keeps one batch in KEEP_EVERY instead (picked by a hash
    of its number: every 16th would be one worker's where workers take turns). So do each
    epoch's first (its wait is the epoch's start-up), each window's slowest (an overdue
    batch's row, a chart's spikes) and last (a stretch of a run's latest rows that begins
    inside a window starts its clock there: ``latest_stretch``). Counts,
    samples and summed times stay exact; a percentile is within one bucket of the exact one.

    Rows wait in a tail of TAIL_S before they are folded (and no longer: a loop away from its
    loader lets them out by the clock): a GPU timing resolved after its batch (LateTimings)
    still finds its row there, and a slow stretch (an epoch's start) is kept row by row.
    Slower loaders are never folded: their rows go through as they came.
    The engine's runs are folded in the parent (run/runner.py), a flush's rows once its late
    timings (sent after them) are on them; a watched loader's by its recorder's thread before
    they are written, each flush's timings put on its batches first (run/recorder.py).

    A fold reads a chunk's batches as numpy columns (``FoldColumns``), every window of the
    chunk in the same few calls, and builds a row only for a batch kept whole: a watched
    loop's batches go in as taken (taken.TakenForm), so most never become a row. Row by row,
    a watched fast loop's recorder built a row for every batch and folded each window in
    Python (long_tail at 0 workers, bench/instructions.py's watched way: 40.8k instructions a
    batch over a plain loop's 530k; 29.1k with numpy columns and only the kept rows built).
"""

from __future__ import annotations

import json
from typing import NamedTuple, Sequence

import numpy as np

from dataloader_tuner.record.rows import BatchRecord

WINDOW_ABOVE_PER_S = 2000.0  # batches a second beyond which rows are kept in windows
WINDOW_S = 0.1  # the time one window covers (cut at an epoch's start)
KEEP_EVERY = 16  # one batch in n of a window stays a whole row (for the charts)
TAIL_S = 1.0  # rows wait this long before they are folded (late GPU timings find them)
HISTOGRAM_PER_DOUBLING = 8
HISTOGRAM_FLOOR_S = 1e-6  # waits under a microsecond share bucket 0


def wait_bucket(seconds: float) -> int:
    """The histogram bucket a wait falls in: 0 under HISTOGRAM_FLOOR_S, then
    HISTOGRAM_PER_DOUBLING buckets for each doubling above it."""
    return wait_buckets((seconds,))[0]


def wait_buckets(waits: Sequence[float]) -> list[int]:
    """``wait_bucket`` of each wait."""
    return wait_buckets_of(np.asarray(waits, dtype=float)).tolist()


def wait_buckets_of(waits: np.ndarray) -> np.ndarray:
    """``wait_bucket`` of each wait, over an array (a fold's: NOTE [ Windows for fast
    loaders ]); the one formula, so rows and windows count a wait in the same bucket."""
    floor = HISTOGRAM_FLOOR_S
    with np.errstate(divide="ignore", invalid="ignore"):  # (waits under the floor: bucket 0)
        scaled = np.floor(np.log2(np.maximum(waits, floor) / floor) * HISTOGRAM_PER_DOUBLING)
    return np.where(waits < floor, 0, 1 + scaled.astype(np.int64))


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """The waits (seconds) bucket ``bucket`` holds, from its lower bound to its upper."""
    if bucket <= 0:
        return 0.0, HISTOGRAM_FLOOR_S
    return (HISTOGRAM_FLOOR_S * 2 ** ((bucket - 1) / HISTOGRAM_PER_DOUBLING),
            HISTOGRAM_FLOOR_S * 2 ** (bucket / HISTOGRAM_PER_DOUBLING))


def bucket_middle(bucket: int) -> float:
    """The wait (seconds) a bucket stands for: its geometric middle (the buckets are
    log-spaced), so within the bucket of any wait it holds."""
    lo, hi = bucket_bounds(bucket)
    return float((lo * hi) ** 0.5) if lo > 0 else hi / 2


def holders(rows: Sequence[BatchRecord], windows: Sequence[BatchWindow]) -> list[int | None]:
    """For each row, the index of the window holding its batch, or None (both in order of
    their batches)."""
    if not windows:  # (most runs: a quarter of a 25,000-row chart's making, row by row)
        return [None] * len(rows)
    found: list[int | None] = []
    at = 0
    for row in rows:
        while at < len(windows) and windows[at].last_seq < row.seq:
            at += 1
        found.append(at if at < len(windows) and windows[at].first_seq <= row.seq else None)
    return found


class BatchWindow(NamedTuple):
    """Consecutive batches of one epoch, folded (NOTE [ Windows for fast loaders ]). Times are
    seconds since the run started; ``t_start`` is when its first batch was asked for and
    ``t_end`` when its last batch's step ended. ``wait_hist`` and ``workers`` are
    ``(bucket, count)`` and ``(worker_id, batches)`` pairs, sorted."""

    first_seq: int
    batches: int
    epoch: int
    t_start: float
    t_end: float
    samples: int
    wait_s: float
    wait_max_s: float
    step_s: float
    step_max_s: float
    wait_hist: tuple[tuple[int, int], ...]
    workers: tuple[tuple[int, int], ...]
    # the GPU's idle gaps before its batches' steps, where timed: how many, summed, largest
    gaps: int = 0
    gap_ms: float = 0.0
    gap_max_ms: float = 0.0

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.batches - 1

    def to_row(self) -> list:
        """As the pipe and the run history carry it: JSON-safe lists."""
        return [*self[:10], [list(p) for p in self.wait_hist], [list(p) for p in self.workers],
                *self[12:]]

    @classmethod
    def from_row(cls, row: Sequence) -> "BatchWindow":
        """From ``to_row``'s lists, or the run history's row (its pairs as JSON text)."""
        hist, workers = (json.loads(v) if isinstance(v, str) else v for v in row[10:12])
        first_seq, batches, epoch, t_start, t_end, samples = row[:6]
        wait_s, wait_max_s, step_s, step_max_s = row[6:10]
        gaps, gap_ms, gap_max_ms = row[12:15] if len(row) > 12 else (0, 0.0, 0.0)
        return cls(int(first_seq), int(batches), int(epoch), t_start, t_end, int(samples),
                   wait_s, wait_max_s, step_s, step_max_s,
                   tuple((int(b), int(n)) for b, n in hist),
                   tuple((int(w), int(n)) for w, n in workers), int(gaps), gap_ms, gap_max_ms)


SAMPLE_HASH, SAMPLE_BELOW = 2654435761, 2**32 // KEEP_EVERY


def sampled(seq: int) -> bool:
    """One batch in KEEP_EVERY, by a hash of its number: every KEEP_EVERY-th would be the same
    worker's each time where 2, 4, 8 or 16 workers take turns."""
    return (seq * SAMPLE_HASH) % 2**32 < SAMPLE_BELOW


def even_sample(rows: Sequence[BatchRecord], where: Sequence[int | None]) -> list[bool]:
    """Which of a folded run's rows (``where``: the window each is in, None outside one) are
    its even sample, as ``kept_whole`` kept them: inside a window with a row whose making
    was timed, those rows; inside another, those ``sampled``; outside windows, all."""
    timed_in = {w for row, w in zip(rows, where) if w is not None and row.fetch_s is not None}
    return [w is None or (row.fetch_s is not None if w in timed_in else sampled(row.seq))
            for row, w in zip(rows, where)]


def latest_stretch(rows: Sequence[BatchRecord], windows: Sequence[BatchWindow]
                   ) -> tuple[list[BatchRecord], list[BatchWindow]]:
    """A run's latest rows (``rows``: its last ones, beginning mid-run) and the windows among
    them, arranged so that the first row starts the stretch's clock: where ``rows`` begin
    inside a window, from that window's last batch on (each window's last is kept whole)."""
    rows = list(rows)
    if not rows or not windows:
        return rows, []
    start = rows[0].seq
    inside = next((w for w in windows if w.first_seq <= start <= w.last_seq), None)
    if inside is not None:
        rows = [r for r in rows if r.seq >= inside.last_seq]
    first = rows[0].seq if rows else start
    return rows, [w for w in windows if w.first_seq > first]
