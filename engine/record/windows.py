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
    still finds its row there, and a slow stretch (an epoch's start) is kept row by row.
    Slower loaders are never folded: their rows go through as they came.
    The engine's runs are folded in the parent (run/runner.py), a flush's rows once its late
    timings (sent after them) are on them; a watched loader's by its recorder's thread before
    they are written, each flush's timings put on its rows first (run/recorder.py).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from collections import Counter
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence, cast

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
    """``wait_bucket`` of each wait, in one comprehension (a call per wait is most of a fold)."""
    floor, per, log2 = HISTOGRAM_FLOOR_S, HISTOGRAM_PER_DOUBLING, math.log2
    return [0 if wait < floor else 1 + int(log2(wait / floor) * per) for wait in waits]


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


# A row's fields by position: the fold reads them as columns (``field_columns``), not by name
SEQ, EPOCH, T_REQUEST, WAIT, STEP, SAMPLES = range(6)
WORKER = BatchRecord._fields.index("worker_id")
FETCH = BatchRecord._fields.index("fetch_s")
GAP = BatchRecord._fields.index("gpu_gap_ms")
FOLDED = (SEQ, EPOCH, T_REQUEST, WAIT, STEP, SAMPLES, WORKER, FETCH, GAP)
SAMPLE_HASH, SAMPLE_BELOW = 2654435761, 2**32 // KEEP_EVERY


def field_columns(rows: Sequence[tuple]) -> list[list[Any]]:
    """The rows' fields as columns, by position: those a fold reads (FOLDED), the others
    empty. A C-speed pass per field (``zip(*rows)``, every field, took 0.5-0.8 us a row against
    0.24 for these nine)."""
    columns: list[list[Any]] = [[] for _ in BatchRecord._fields]
    for index in FOLDED:
        columns[index] = list(map(itemgetter(index), rows))
    return columns


def fold(columns: Sequence[Sequence[Any]], lo: int, hi: int, t_end: float) -> BatchWindow:
    """The window of rows ``lo..hi-1`` of ``columns`` (a row's fields, each a column), whose
    last batch's step ended at ``t_end``."""
    waits, steps = columns[WAIT][lo:hi], columns[STEP][lo:hi]
    hist = Counter(wait_buckets(waits))
    workers = Counter(columns[WORKER][lo:hi])
    gaps = [gap for gap in columns[GAP][lo:hi] if gap is not None]
    return BatchWindow(
        columns[SEQ][lo], hi - lo, columns[EPOCH][lo], columns[T_REQUEST][lo], t_end,
        sum(columns[SAMPLES][lo:hi]), sum(waits), max(waits), sum(steps), max(steps),
        tuple(sorted(hist.items())), tuple(sorted(workers.items())),
        len(gaps), sum(gaps), max(gaps, default=0.0))


def sampled(seq: int) -> bool:
    """One batch in KEEP_EVERY, by a hash of its number: every KEEP_EVERY-th would be the same
    worker's each time where 2, 4, 8 or 16 workers take turns."""
    return (seq * SAMPLE_HASH) % 2**32 < SAMPLE_BELOW


def kept_whole(seqs: Sequence[int], fetch_s: Sequence[float | None]) -> list[bool]:
    """Which folded batches stay rows for what they are, by their numbers and fetch times:
    one in KEEP_EVERY (``sampled``, written out: a call per batch is most of the cost) and
    each timed one. (Thinner._thin keeps a window's first of an epoch, last and slowest.)"""
    return [(seq * SAMPLE_HASH) % 2**32 < SAMPLE_BELOW or fetch is not None
            for seq, fetch in zip(seqs, fetch_s)]


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
    tail: list[BatchRecord] = field(default_factory=list)
    last_epoch: int | None = None  # of the last row out: a new one opens an epoch

    def arrived(self, rows: Sequence[tuple], now: float | None = None, hold: bool = False
                ) -> tuple[list[tuple], list[BatchWindow]]:
        """Rows as they arrive (BatchRecord's fields): while batches come slower than
        WINDOW_ABOVE_PER_S they go straight out as they are, else through the tail. ``now``:
        seconds since the run started, where known (see ``take``). ``hold``: nothing is folded
        yet, so the GPU timings of these rows go on them (``late``) before ``take``: rows that
        arrive already older than TAIL_S (a flush long in coming) would be folded at once,
        and a timing put after that is lost."""
        if not self.tail and not fast(rows):
            if rows:
                self.last_epoch = rows[-1][1]
            return list(rows), []
        # (rows of one kind: BatchRecords already, or the plain tuples of the pipe's JSON)
        if rows and rows[0].__class__ is not BatchRecord:
            rows = [BatchRecord.from_row(row) for row in rows]
        self.tail.extend(cast("Sequence[BatchRecord]", rows))
        if hold:
            return [], []
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
        tail = self.tail
        if not tail:
            return [], []
        horizon = max(_end(tail[-1]), now or 0.0) - TAIL_S
        # The rows that ended before the horizon, up to the first that did not. A batch ends
        # after the one before it, so a bisect finds them; where rows came out of order (two
        # iterators of one watched loader at once) the first too late among them cuts it.
        out = tail[:bisect_left(tail, horizon, key=_end)]
        late = [i for i, row in enumerate(out)  # (_end written out: a call a row costs)
                if row[2] + row[3] + row[4] >= horizon]
        if late:
            out = out[:late[0]]
        del tail[:len(out)]
        return self._thin(out)

    def flush(self) -> tuple[list[BatchRecord], list[BatchWindow]]:
        """Everything left (the run ended)."""
        out = self.tail[:]
        self.tail.clear()
        return self._thin(out)

    def _thin(self, rows: list[BatchRecord]) -> tuple[list[BatchRecord], list[BatchWindow]]:
        """``rows`` cut into windows of one epoch each spanning at most WINDOW_S; those that
        came faster than WINDOW_ABOVE_PER_S folded. Read as columns: ~2x fewer instructions a
        row than row by row (bench/instructions.py)."""
        loose = self.loose_below
        kept = [row for row in rows if row.seq < loose]
        rest = [row for row in rows if row.seq >= loose]
        windows: list[BatchWindow] = []
        if not rest:
            return kept, windows
        columns = field_columns(rest)
        epochs, starts = columns[EPOCH], columns[T_REQUEST]
        ends = [start + wait + step for start, wait, step in zip(starts, columns[WAIT],
                                                                  columns[STEP])]
        cuts = window_cuts(epochs, starts, ends)
        for lo, hi in zip(cuts, cuts[1:]):
            span = ends[hi - 1] - starts[lo]
            rate = (hi - lo) / span if span > 0 else math.inf
            opens_epoch, self.last_epoch = epochs[lo] != self.last_epoch, epochs[lo]
            if rate <= WINDOW_ABOVE_PER_S or hi - lo < KEEP_EVERY:
                kept.extend(rest[lo:hi])
                continue
            windows.append(fold(columns, lo, hi, ends[hi - 1]))
            # its slowest (an overdue batch's row; the spikes of a chart) and its last (where a
            # stretch that begins inside it starts its clock: latest_stretch) stay rows too;
            # an epoch's first too (its wait is the epoch's start-up)
            waits = columns[WAIT][lo:hi]
            also = {lo + waits.index(max(waits)), hi - 1, lo if opens_epoch else hi - 1}
            whole = kept_whole(columns[SEQ][lo:hi], columns[FETCH][lo:hi])
            kept.extend(rest[i] for i in range(lo, hi) if whole[i - lo] or i in also)
        return kept, windows


def window_cuts(epochs: Sequence[int], starts: Sequence[float], ends: Sequence[float]
                ) -> list[int]:
    """Where the windows of batches with these epochs, start and end times begin (and, last,
    where they all end): at each new epoch, and at the first batch that ended more than
    WINDOW_S after its window's first was asked for. Where the batches are of one epoch and
    ended in order (one iterator's: nearly always), each cut is a bisect (a loop over every
    batch took 0.11 us a batch, the bisects 0.013)."""
    n = len(ends)
    if epochs.count(epochs[0]) == n and ends == sorted(ends):
        cuts, lo = [0], 0
        while lo < n:
            begin = starts[lo]
            lo = bisect_right(ends, WINDOW_S, lo + 1, n, key=lambda end: end - begin)
            cuts.append(lo)
        return cuts
    cuts, begin, epoch = [0], starts[0], epochs[0]
    for i in range(1, n):
        if epochs[i] != epoch or ends[i] - begin > WINDOW_S:
            cuts.append(i)
            begin, epoch = starts[i], epochs[i]
    cuts.append(n)
    return cuts


def _end(row: Sequence[Any]) -> float:
    """When a row's step ended (its t_ready + step_s), since the run started."""
    return row[T_REQUEST] + row[WAIT] + row[STEP]


def fast(rows: Sequence[tuple]) -> bool:
    """Rows (BatchRecord's fields) of batches that came faster than WINDOW_ABOVE_PER_S."""
    if len(rows) < KEEP_EVERY:
        return False
    first, last = rows[0], rows[-1]
    span = _end(last) - first[T_REQUEST]
    return span <= 0 or len(rows) / span > WINDOW_ABOVE_PER_S
