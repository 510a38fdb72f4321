"""Batches kept in windows where they come too fast to keep one row each.

NOTE [ Windows for fast loaders ]

    A loader making 8,000 batches a second (tests/real/long_tail.py at 0 workers) made 8,000
    rows a second: 480k rows held by the dashboard's process and written to the run history
    for one minute's profile, and as many read back to draw a chart of a few hundred points.
    Beyond WINDOW_ABOVE_PER_S the rows are folded into windows of WINDOW_S: a window keeps its
    batches' count, samples, summed and largest wait and step, each worker's count, and a
    histogram of the waits (log-spaced buckets, HISTOGRAM_PER_DOUBLING a doubling: each ~9%
    wide) from which the latency percentiles are read, and the GPU's idle gaps where timed
    (count, sum, largest). One batch in KEEP_EVERY (picked by a hash of its number: every
    16th would be one worker's where workers take turns) stays a whole row, an even sample
    for the charts and the medians of steps and copies, as do the batches whose making was
    timed (the workers' busy shares and per-batch costs are read from those, scaled by the
    windows' counts), each epoch's first (its wait is the epoch's start-up), each window's
    slowest (an overdue batch's row, a chart's spikes) and last (a stretch of a run's latest
    rows that begins inside a window starts its clock there: ``latest_stretch``). Counts,
    samples and summed times stay exact; a percentile is within one bucket of the exact one.

    Rows wait in a tail of TAIL_S before they are folded (and no longer: a loop away from its
    loader lets them out by the clock): a GPU timing resolved after its batch (LateTimings)
    still finds its row there, and a slow stretch (an epoch's start) is kept row by row. Slower loaders are never folded: their rows go through as they came.
    The engine's runs are folded in the parent (run/runner.py), as the rows arrive; a
    watched loader's by its recorder's thread before they are written (run/recorder.py).
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

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
    if seconds < HISTOGRAM_FLOOR_S:
        return 0
    return 1 + int(math.log2(seconds / HISTOGRAM_FLOOR_S) * HISTOGRAM_PER_DOUBLING)


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


def fold(rows: Sequence[BatchRecord]) -> BatchWindow:
    """One window of ``rows`` (consecutive, one epoch, at least one)."""
    hist: dict[int, int] = {}
    workers: dict[int, int] = {}
    for row in rows:
        bucket = wait_bucket(row.wait_s)
        hist[bucket] = hist.get(bucket, 0) + 1
        workers[row.worker_id] = workers.get(row.worker_id, 0) + 1
    gaps = [r.gpu_gap_ms for r in rows if r.gpu_gap_ms is not None]
    first, last = rows[0], rows[-1]
    return BatchWindow(
        first.seq, len(rows), first.epoch, first.t_request, last.t_ready + last.step_s,
        sum(r.samples for r in rows), sum(r.wait_s for r in rows), max(r.wait_s for r in rows),
        sum(r.step_s for r in rows), max(r.step_s for r in rows),
        tuple(sorted(hist.items())), tuple(sorted(workers.items())),
        len(gaps), sum(gaps), max(gaps, default=0.0))


def sampled(seq: int) -> bool:
    """One batch in KEEP_EVERY, by a hash of its number: every KEEP_EVERY-th would be the same
    worker's each time where 2, 4, 8 or 16 workers take turns."""
    return (seq * 2654435761) % 2**32 < 2**32 // KEEP_EVERY


def kept_whole(row: BatchRecord, first_of_epoch: bool) -> bool:
    """A folded batch that also stays a row: one in KEEP_EVERY (``sampled``), a timed one
    and an epoch's first (the window's last and slowest too: Thinner._thin)."""
    return sampled(row.seq) or first_of_epoch or row.fetch_s is not None


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


@dataclass
class Thinner:
    """Rows in, rows and windows out (NOTE [ Windows for fast loaders ]): rows as they
    arrive (``arrived``), ``flush`` at the run's end; a GPU timing resolved after its batch
    finds its row while that waits in the tail (``late``)."""

    loose_below: int = 0  # batches numbered below this (the warm-up) stay rows
    tail: deque[BatchRecord] = field(default_factory=deque)
    last_epoch: int | None = None  # of the last row out: a new one opens an epoch

    def arrived(self, rows: Sequence[tuple], now: float | None = None
                ) -> tuple[list[tuple], list[BatchWindow]]:
        """Rows as they arrive (BatchRecord's fields): while batches come slower than
        WINDOW_ABOVE_PER_S they go straight out as they are, else through the tail. ``now``:
        seconds since the run started, where known (see ``take``)."""
        if not self.tail and not fast(rows):
            if rows:
                self.last_epoch = rows[-1][1]
            return list(rows), []
        self.tail.extend(BatchRecord.from_row(row) for row in rows)
        kept, windows = self.take(now)
        return list(kept), windows

    def late(self, seq: int, **timings: Any) -> bool:
        """A GPU timing resolved after batch ``seq``: onto its row if it is still in the tail
        (True), else False (it has gone out: the timing goes after it)."""
        if not self.tail:
            return False
        index = seq - self.tail[0].seq
        if not (0 <= index < len(self.tail) and self.tail[index].seq == seq):
            return False
        self.tail[index] = self.tail[index]._replace(**timings)
        return True

    def take(self, now: float | None = None) -> tuple[list[BatchRecord], list[BatchWindow]]:
        """Rows and windows for everything more than TAIL_S older than the newest row, or than
        ``now`` (seconds since the run started: a loop away from its loader lets its rows out)."""
        if not self.tail:
            return [], []
        newest = self.tail[-1]
        horizon = max(newest.t_ready + newest.step_s, now or 0.0) - TAIL_S
        out: list[BatchRecord] = []
        while self.tail and self.tail[0].t_ready + self.tail[0].step_s < horizon:
            out.append(self.tail.popleft())
        return self._thin(out)

    def flush(self) -> tuple[list[BatchRecord], list[BatchWindow]]:
        """Everything left (the run ended)."""
        out = list(self.tail)
        self.tail.clear()
        return self._thin(out)

    def _thin(self, rows: list[BatchRecord]) -> tuple[list[BatchRecord], list[BatchWindow]]:
        kept = [r for r in rows if r.seq < self.loose_below]
        windows: list[BatchWindow] = []
        for chunk in _chunks([r for r in rows if r.seq >= self.loose_below]):
            span = chunk[-1].t_ready + chunk[-1].step_s - chunk[0].t_request
            rate = len(chunk) / span if span > 0 else math.inf
            opens = [r.epoch != prev for r, prev in
                     zip(chunk, [self.last_epoch, *(r.epoch for r in chunk[:-1])])]
            self.last_epoch = chunk[-1].epoch
            if rate <= WINDOW_ABOVE_PER_S or len(chunk) < KEEP_EVERY:
                kept.extend(chunk)
                continue
            windows.append(fold(chunk))
            # its slowest (an overdue batch's row; the spikes of a chart) and its last (where a
            # stretch that begins inside it starts its clock: latest_stretch) stay rows too
            slowest = max(chunk, key=lambda r: r.wait_s)
            kept.extend(r for r, first in zip(chunk, opens)
                        if kept_whole(r, first) or r is slowest or r is chunk[-1])
        return kept, windows


def fast(rows: Sequence[tuple]) -> bool:
    """Rows (BatchRecord's fields) of batches that came faster than WINDOW_ABOVE_PER_S."""
    if len(rows) < KEEP_EVERY:
        return False
    first, last = rows[0], rows[-1]
    span = last[2] + last[3] + last[4] - first[2]  # t_request + wait + step, less t_request
    return span <= 0 or len(rows) / span > WINDOW_ABOVE_PER_S


def _chunks(rows: list[BatchRecord]) -> list[list[BatchRecord]]:
    """``rows`` cut into runs of one epoch each spanning at most WINDOW_S."""
    chunks: list[list[BatchRecord]] = []
    for row in rows:
        current = chunks[-1] if chunks else None
        if (current is None or row.epoch != current[0].epoch
                or row.t_ready + row.step_s - current[0].t_request > WINDOW_S):
            chunks.append([row])
        else:
            current.append(row)
    return chunks
