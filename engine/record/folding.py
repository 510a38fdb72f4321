"""Batches in, rows and windows out: how fast batches are folded into windows (NOTE [ Windows
for fast loaders ], windows.py), a chunk at a time as numpy columns, and which of them stay
whole rows."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np

from dataloader_tuner.record.forms import EPOCH, ROWS, BatchForm, FoldColumns
from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.record.windows import (KEEP_EVERY, SAMPLE_BELOW, SAMPLE_HASH, TAIL_S,
                                             WINDOW_ABOVE_PER_S, WINDOW_S, BatchWindow,
                                             wait_buckets_of)


class Cuts(NamedTuple):
    """A chunk of batches cut into spans (``lo``/``hi``: each span's first and past-the-last
    position), with the span of each batch (``span_of``) and which spans are folded."""

    lo: np.ndarray
    hi: np.ndarray
    span_of: np.ndarray
    folded: np.ndarray


def fold(columns: FoldColumns, ends: np.ndarray, cuts: Cuts) -> list[BatchWindow]:
    """The windows of the folded spans of ``columns`` (``ends``: when each batch's step ended),
    every figure of every window in one pass over the chunk: a few numpy calls a chunk, not a
    few a window (a window can be one short epoch's 90 batches)."""
    folded = np.flatnonzero(cuts.folded)
    if not len(folded):
        return []
    lo, hi = cuts.lo, cuts.hi
    gaps_timed = ~np.isnan(columns.gap)
    sums = [np.add.reduceat(values, lo)[folded].tolist() for values in (
        columns.samples, columns.wait, columns.step, gaps_timed.astype(np.int64),
        np.where(gaps_timed, columns.gap, 0.0))]
    maxes = [np.maximum.reduceat(values, lo)[folded].tolist() for values in (
        columns.wait, columns.step, np.where(gaps_timed, columns.gap, 0.0))]
    inside = cuts.folded[cuts.span_of]  # the batches in folded spans
    hists = _counted(cuts.span_of[inside], wait_buckets_of(columns.wait[inside]), folded)
    workers = _counted(cuts.span_of[inside], columns.worker[inside], folded)
    firsts = lo[folded].tolist()
    seqs, epochs = columns.seq[firsts].tolist(), columns.epoch[firsts].tolist()
    starts, t_ends = columns.start[firsts].tolist(), ends[hi[folded] - 1].tolist()
    counts = (hi - lo)[folded].tolist()
    samples, waits, steps, gaps, gap_ms = sums
    wait_max, step_max, gap_max = maxes
    return [BatchWindow(seqs[k], counts[k], epochs[k], starts[k], t_ends[k], samples[k],
                        waits[k], wait_max[k], steps[k], step_max[k], hists[k], workers[k],
                        gaps[k], gap_ms[k], gap_max[k]) for k in range(len(folded))]


def _counted(spans: np.ndarray, values: np.ndarray, folded: np.ndarray
             ) -> list[tuple[tuple[int, int], ...]]:
    """For each span in ``folded`` (in order), its ``(value, count)`` pairs, sorted: one
    np.unique over every batch's (span, value), not one a window."""
    low = int(values.min())
    width = int(values.max()) - low + 1
    keys, counts = np.unique(spans * width + (values - low), return_counts=True)
    value = (keys % width + low).tolist()
    counts_list = counts.tolist()
    bounds = np.searchsorted(keys // width, np.append(folded, folded[-1] + 1)).tolist()
    return [tuple(zip(value[bounds[k]:bounds[k + 1]], counts_list[bounds[k]:bounds[k + 1]]))
            for k in range(len(folded))]



def kept_whole(seqs: np.ndarray, timed: np.ndarray, lo: np.ndarray, span_of: np.ndarray
               ) -> np.ndarray:
    """Which folded batches stay rows for what they are, by their numbers and whether their
    making was timed (``lo``: where each window's batches begin, ``span_of``: each batch's
    window): each timed one, which is the window's sample where it has any (a fast batch's
    making is timed on one in probes.TIME_EVERY of each process, KEEP_EVERY's rate: a hashed
    sample beside them kept twice the rows, and on long_tail's 0 workers their writing cost
    ~4.5k instructions of a watched batch's 29k over a plain loop's), else one in KEEP_EVERY
    (``sampled``, over the column). ``even_sample`` picks the same from the rows. (Thinner
    keeps a window's first of an epoch, last and slowest beside.)"""
    hashed = (seqs.astype(np.uint64) * np.uint64(SAMPLE_HASH)) % np.uint64(2**32)
    untimed_window = np.add.reduceat(timed.astype(np.int64), lo) == 0
    return timed | ((hashed < SAMPLE_BELOW) & untimed_window[span_of])



@dataclass
class Thinner:
    """Batches in, rows and windows out (NOTE [ Windows for fast loaders ]): batches as they
    arrive (``arrived``), ``flush`` at the run's end; a GPU timing resolved after its batch
    finds it while it waits in the tail (``late``). ``form``: what the batches are (rows, or
    a watched loop's batches as taken); what comes out is rows."""

    loose_below: int = 0  # batches numbered below this (the warm-up) stay rows
    form: BatchForm = ROWS
    tail: list[Any] = field(default_factory=list)
    last_epoch: int | None = None  # of the last batch out: a new one opens an epoch
    # GPU timings resolved after their batch, put on it as it leaves the tail: {seq: fields}
    timings: dict[int, dict[str, Any]] = field(default_factory=dict)

    def arrived(self, batches: Sequence[Any], now: float | None = None, hold: bool = False
                ) -> tuple[list[BatchRecord], list[BatchWindow]]:
        """Batches as they arrive: while they come slower than WINDOW_ABOVE_PER_S they go
        straight out as rows, else through the tail. ``now``: seconds since the run started,
        where known (see ``take``). ``hold``: nothing is folded yet, so the GPU timings of
        these batches go on them (``late``) before ``take``: batches that arrive already older
        than TAIL_S (a flush long in coming) would be folded at once, and a timing put after
        that is lost."""
        if not self.tail and not self._fast(batches):
            if batches:
                self.last_epoch = batches[-1][EPOCH]
            return self.form.rows(batches), []
        self.tail.extend(batches)
        if hold:
            return [], []
        return self.take(now)

    def late(self, seq: int, **timings: Any) -> bool:
        """A GPU timing resolved after batch ``seq``: onto it if it is still in the tail
        (True), else False (it has gone out: the timing goes after it)."""
        if not self.tail:
            return False
        number = self.form.seq
        index = seq - number(self.tail[0])
        if not (0 <= index < len(self.tail) and number(self.tail[index]) == seq):
            return False
        self.timings.setdefault(seq, {}).update(timings)
        return True

    def take(self, now: float | None = None) -> tuple[list[BatchRecord], list[BatchWindow]]:
        """Rows and windows for everything more than TAIL_S older than the newest batch, or
        than ``now`` (seconds since the run started: a loop away from its loader lets its
        batches out)."""
        tail = self.tail
        if not tail:
            return [], []
        end = self.form.end
        horizon = max(end(tail[-1]), now or 0.0) - TAIL_S
        # The batches that ended before the horizon, up to the first that did not. A batch
        # ends after the one before it, so a bisect finds them; where they came out of order
        # (two iterators of one watched loader at once) the first too late among them cuts it.
        out = tail[:bisect_left(tail, horizon, key=end)]
        if not out:
            return [], []
        # (out of the tail first: batches a fold cannot read are dropped once, not met again
        # at every flush while the tail grows)
        del tail[:len(out)]
        columns = self.form.columns(out)
        late = np.flatnonzero(columns.start + columns.wait + columns.step >= horizon)
        if len(late):
            cut = int(late[0])
            tail[:0] = out[cut:]
            out, columns = out[:cut], columns.take(slice(0, cut))
        return self._thin(out, columns)

    def flush(self) -> tuple[list[BatchRecord], list[BatchWindow]]:
        """Everything left (the run ended)."""
        out = self.tail[:]
        self.tail.clear()
        return self._thin(out, self.form.columns(out)) if out else ([], [])

    def _fast(self, batches: Sequence[Any]) -> bool:
        """Batches that came faster than WINDOW_ABOVE_PER_S."""
        if len(batches) < KEEP_EVERY:
            return False
        span = self.form.end(batches[-1]) - self.form.start(batches[0])
        return span <= 0 or len(batches) / span > WINDOW_ABOVE_PER_S

    def _thin(self, batches: list[Any], columns: FoldColumns
              ) -> tuple[list[BatchRecord], list[BatchWindow]]:
        """``batches`` (``columns`` theirs) cut into windows of one epoch each spanning at most
        WINDOW_S; those that came faster than WINDOW_ABOVE_PER_S folded, and only the rows
        kept whole built (the fold reads numpy columns: NOTE [ Windows for fast loaders ])."""
        timings = self.timings
        waiting = self._waiting(columns) if timings else {}
        if waiting:
            columns = self._timed_gaps(columns, waiting)
        loose = columns.seq < self.loose_below
        keep: list[int] = np.flatnonzero(loose).tolist()
        windows: list[BatchWindow] = []
        if not loose.all():
            rest = np.flatnonzero(~loose)
            inside = self._windows(columns.take(rest) if keep else columns, windows)
            keep += rest[inside].tolist() if inside else []
        rows = self.form.rows([batches[i] for i in keep])
        if waiting:
            rows = [row._replace(**timings[row.seq]) if row.seq in waiting else row
                    for row in rows]
            for seq in waiting:  # (a folded batch's gap is in its window's)
                del timings[seq]
        return rows, windows

    def _waiting(self, columns: FoldColumns) -> dict[int, int]:
        """The batches of ``columns`` with a late timing waiting: {seq: position}, found from
        the timings (a few) rather than the batches (thousands a flush)."""
        seqs = columns.seq
        if not len(seqs):
            return {}
        first = int(seqs[0])
        in_order = int(seqs[-1]) - first == len(seqs) - 1 and bool(np.all(np.diff(seqs) == 1))
        if not in_order:  # (two iterators' batches taking turns: rare)
            position = {s: i for i, s in enumerate(seqs.tolist())}
            return {seq: position[seq] for seq in self.timings if seq in position}
        return {seq: seq - first for seq in self.timings if 0 <= seq - first < len(seqs)}

    def _windows(self, columns: FoldColumns, windows: list[BatchWindow]) -> list[int]:
        """Fold ``columns`` into ``windows`` (appended); the positions of the batches that stay
        rows, in order: all those of spans not folded (slower than WINDOW_ABOVE_PER_S, or
        fewer than KEEP_EVERY), and of a folded one those ``kept_whole``, its slowest (an
        overdue batch's row; the spikes of a chart), its last (where a stretch that begins
        inside it starts its clock: latest_stretch) and an epoch's first (its wait is the
        epoch's start-up)."""
        ends = columns.start + columns.wait + columns.step
        at = np.asarray(window_cuts(columns.epoch.tolist(), columns.start.tolist(),
                                    ends.tolist()))
        lo, hi = at[:-1], at[1:]
        batches = hi - lo
        spans = ends[hi - 1] - columns.start[lo]
        with np.errstate(divide="ignore"):
            rates = np.where(spans > 0, batches / np.where(spans > 0, spans, 1.0), np.inf)
        span_of = np.repeat(np.arange(len(lo)), batches)
        cuts = Cuts(lo, hi, span_of, (rates > WINDOW_ABOVE_PER_S) & (batches >= KEEP_EVERY))
        windows += fold(columns, ends, cuts)
        epochs = columns.epoch[lo]
        # (each span against the one before it; the first against the last batch out)
        before = np.append([-1 if self.last_epoch is None else self.last_epoch], epochs[:-1])
        opens_epoch = epochs != before
        self.last_epoch = int(epochs[-1])
        keep = ~cuts.folded[span_of] | kept_whole(columns.seq, columns.timed, lo, span_of)
        keep[hi[cuts.folded] - 1] = True
        keep[lo[cuts.folded & opens_epoch]] = True
        slowest = np.where(columns.wait == np.maximum.reduceat(columns.wait, lo)[span_of],
                           np.arange(len(span_of)), len(span_of))
        keep[np.minimum.reduceat(slowest, lo)[cuts.folded]] = True
        return np.flatnonzero(keep).tolist()

    def _timed_gaps(self, columns: FoldColumns, waiting: dict[int, int]) -> FoldColumns:
        """``columns`` with the GPU gaps resolved after their batches (``waiting``: their
        positions) on them."""
        gaps = columns.gap.copy()
        for seq, at in waiting.items():
            gap = self.timings[seq].get("gpu_gap_ms")
            if gap is not None:
                gaps[at] = gap
        return columns._replace(gap=gaps)


def window_cuts(epochs: Sequence[int], starts: Sequence[float], ends: Sequence[float]
                ) -> list[int]:
    """Where the windows of batches with these epochs, start and end times begin (and, last,
    where they all end): at each new epoch, and at the first batch that ended more than
    WINDOW_S after its window's first was asked for. Within an epoch's batches that ended in
    order (one iterator's: nearly always), each cut is a bisect (a loop over every batch took
    0.11 us a batch, the bisects 0.013); the epochs' starts are found by numpy."""
    n = len(ends)
    numbers = np.asarray(epochs)
    bounds = [0, *(np.flatnonzero(numbers[1:] != numbers[:-1]) + 1).tolist(), n]
    cuts: list[int] = []
    for lo, hi in zip(bounds, bounds[1:]):
        cuts += _cuts_in_epoch(starts, ends, lo, hi)
    cuts.append(n)
    return cuts


def _cuts_in_epoch(starts: Sequence[float], ends: Sequence[float], lo: int, hi: int
                   ) -> list[int]:
    """``window_cuts`` of batches ``lo..hi-1``, all of one epoch: where each window begins."""
    cuts = [lo]
    if ends[lo:hi] == sorted(ends[lo:hi]):
        while True:
            begin = starts[lo]
            lo = bisect_right(ends, WINDOW_S, lo + 1, hi, key=lambda end: end - begin)
            if lo >= hi:
                return cuts
            cuts.append(lo)
    begin = starts[lo]
    for i in range(lo + 1, hi):
        if ends[i] - begin > WINDOW_S:
            cuts.append(i)
            begin = starts[i]
    return cuts
