"""A batch as a watched loop took it, its row built later on the recorder's thread.

NOTE [ A watched batch's row built off the job's thread ]

    A watched loop runs on the job's own thread, so whatever it does per batch the job waits
    for. Building a ``BatchRecord`` there (the ledger's call with nine arguments, five
    subtractions, a 16-field tuple) was most of what the loop did beyond timing the batch.
    The loop keeps what it measured as one flat tuple instead, a ``TakenBatch``: the batch's
    number, its epoch, its three clock readings (``time.monotonic``: asked for, handed over,
    the loop back for the next), the meta it came with and the step's GPU times. The
    recorder's thread turns them into rows at each flush (``rows_of_taken``), where a GPU job's
    step lets the GIL go often. Unlike the engine's columns (columns.py), each batch carries
    its number and epoch: two iterators of one watched loader may run at once, their batches
    taken out of order.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Sequence

import numpy as np

from dataloader_tuner.record.rows import BatchMeta, BatchRecord, UntimedMeta
from dataloader_tuner.record.forms import FoldColumns

# (seq, epoch, t_request, t_ready, t_back, meta, (h2d_ms, other_ms, gap_ms))
TakenBatch = tuple[int, int, float, float, float, BatchMeta | UntimedMeta,
                   tuple[float | None, float | None, float | None]]
NBYTES = BatchMeta._fields.index("nbytes")
SAMPLES = BatchMeta._fields.index("samples")
NO_STEP_TIMES = (None, None, None)  # a loop's step times where it timed none


def rows_of_taken(t0: float, taken: Sequence[TakenBatch]) -> list[BatchRecord]:
    """The rows of batches taken (times since ``t0``, the run's start). A batch whose making
    was not timed (fast batches' are timed on a sample; a loader that could not be probed) has
    its fetch figures None."""
    rows: list[BatchRecord] = []
    new, add = tuple.__new__, rows.append  # (a NamedTuple's own constructor is 4x slower)
    for seq, epoch, t_request, t_ready, t_back, meta, (h2d, other, gap) in taken:
        if len(meta) == 3:  # (a timed meta has 9 fields, 8 as the engine's columns keep it)
            worker_id, pid, samples = meta  # an UntimedMeta
            add(new(BatchRecord, (
                seq, epoch, t_request - t0, t_ready - t_request, t_back - t_ready, samples,
                None, worker_id, pid, None, None, None, None, h2d, other, gap)))
        else:
            worker_id, pid, fetch_start, fetch_s, collate_s, fetch_cpu_s, samples, nbytes = (
                meta[:8])  # timed (its probe went to the ledger)
            add(new(BatchRecord, (
                seq, epoch, t_request - t0, t_ready - t_request, t_back - t_ready, samples,
                nbytes, worker_id, pid, fetch_start - t0, fetch_s, collate_s, fetch_cpu_s, h2d,
                other, gap)))
    return rows


def seconds_of_taken(taken: Sequence[TakenBatch], most: int) -> list[float]:
    """Up to ``most`` batches' wait plus step, spread over ``taken`` (a stall watch's usual
    time)."""
    step = max(1, len(taken) // most)
    return [batch[4] - batch[2] for batch in taken[::step]]  # t_back - t_request


def latest_bytes(taken: Sequence[TakenBatch], look_back: int = 64) -> int | None:
    """The size of the latest batch among the last ``look_back`` whose size was read."""
    for batch in reversed(taken[-look_back:]):
        meta = batch[5]
        if meta.__class__ is not tuple and meta[NBYTES]:
            return meta[NBYTES]
    return None


def ended(last: TakenBatch, t_end: float) -> TakenBatch:
    """The epoch's last batch, its wait taking in the epoch's end at ``t_end``
    (time.monotonic): a wrapper that asks one batch ahead (accelerate) asks for the end (the
    workers shutting down) before it hands the last batch over, inside the loop's wait. Its
    step keeps its length, moved later by as much."""
    seq, epoch, t_request, t_ready, t_back, meta, steps = last
    extra = max(t_end - t_back, 0.0)
    return (seq, epoch, t_request, t_ready + extra, t_back + extra, meta, steps)


class TakenForm:
    """A watched loop's batches as taken, for a Thinner (record/folding.py) to fold straight
    into windows: only the rows it keeps whole are built (NOTE [ Windows for fast loaders ]).
    ``t0``: the run's start, what the rows' times count from."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0

    @staticmethod
    def seq(batch: TakenBatch) -> int:
        return batch[0]

    def start(self, batch: TakenBatch) -> float:
        return batch[2] - self.t0

    def end(self, batch: TakenBatch) -> float:
        return batch[4] - self.t0

    def columns(self, taken: Sequence[TakenBatch]) -> FoldColumns:
        n = len(taken)

        def column(index: int, kind: type, of: Sequence[Any] = taken) -> np.ndarray:
            return np.fromiter(map(itemgetter(index), of), kind, n)

        request, ready, back = column(2, float), column(3, float), column(4, float)
        metas = list(map(itemgetter(5), taken))
        timed = np.fromiter(map(len, metas), np.int64, n) != 3  # (an UntimedMeta has 3 fields)
        # an UntimedMeta's samples (3rd); a timed meta's 3rd is its fetch's start: replaced
        samples = column(2, float, metas)
        for i in np.flatnonzero(timed).tolist():
            samples[i] = metas[i][SAMPLES]
        steps = list(map(itemgetter(6), taken))
        gaps = np.full(n, np.nan)
        if steps.count(NO_STEP_TIMES) != n:  # (a GPU job's: its step timed around each batch)
            for i, (_h2d, _other, gap) in enumerate(steps):
                if gap is not None:
                    gaps[i] = gap
        return FoldColumns(column(0, np.int64), column(1, np.int64), request - self.t0,
                           ready - request, back - ready, samples.astype(np.int64),
                           column(0, np.int64, metas), timed, gaps)

    def rows(self, taken: Sequence[TakenBatch]) -> list[BatchRecord]:
        return rows_of_taken(self.t0, taken)
