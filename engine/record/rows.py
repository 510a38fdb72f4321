"""The per-batch row: what every measuring loop records for each batch, what the pipe and the
run history carry, and what analysis reads. Its own module so that the protocol, the store and
the loops learn its layout without importing the analysis package."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Iterable, Mapping, NamedTuple, Sequence


class BatchRecord(NamedTuple):
    """One batch as the consumer saw it. Times are seconds since the run started.

    ``t_request`` is when the consumer called ``next()``; it got the batch ``wait_s`` later and
    then spent ``step_s`` in its step. ``fetch_start``/``fetch_s``/``collate_s`` were measured in
    the worker that made the batch (``worker_id`` -1: the main process).

    A NamedTuple rather than a dataclass: one is built per batch in the measuring loop, where
    a frozen dataclass's construction cost shows up against tiny in-memory batches.
    """

    seq: int
    epoch: int
    t_request: float
    wait_s: float
    step_s: float
    samples: int
    nbytes: int | None
    worker_id: int
    worker_pid: int
    # Where the batch's making was timed; None on batches it was not (fast batches' making is
    # timed on a sample: probes.TIME_EVERY), and on a loader that could not be probed.
    fetch_start: float | None
    fetch_s: float | None
    collate_s: float | None
    # CPU time the worker spent in the fetch (its process clock). It and nbytes are None on
    # batches they were not read for: sampled when batches come fast (probes.SAMPLE_EVERY).
    fetch_cpu_s: float | None = None
    h2d_ms: float | None = None
    h2d_other_ms: float | None = None  # the other memory kind (pageable if pinned), sampled
    gpu_gap_ms: float | None = None

    @property
    def t_ready(self) -> float:
        return self.t_request + self.wait_s

    @property
    def worker_end(self) -> float | None:
        if self.fetch_start is None or self.fetch_s is None or self.collate_s is None:
            return None
        return self.fetch_start + self.fetch_s + self.collate_s

    def to_row(self) -> tuple[Any, ...]:
        return tuple(self)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "BatchRecord":
        """The row as a BatchRecord (one already is: the parent's rows from columns)."""
        return row if isinstance(row, BatchRecord) else cls(*row)

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


def row_index(rows: Sequence[BatchRecord], seq: int) -> int | None:
    """Where batch ``seq``'s row is in ``rows`` (in order of their batches, maybe not every
    batch's: record/windows.py), or None."""
    index = bisect_left(rows, seq, key=lambda row: row.seq)
    return index if index < len(rows) and rows[index].seq == seq else None


BATCH_COLUMNS = BatchRecord._fields
INT_BATCH_COLUMNS = frozenset({"seq", "epoch", "samples", "worker_id", "worker_pid"})
# An int where present, None on batches it was not read for (sampled, see probes.READ_SHARE).
OPTIONAL_INT_COLUMNS = frozenset({"nbytes"})


class TimedBatch(NamedTuple):
    """A batch whose making was timed: its row's fetch and collate figures, all present."""

    seq: int
    worker_id: int
    worker_pid: int
    fetch_start: float
    fetch_s: float
    collate_s: float
    fetch_cpu_s: float | None
    nbytes: int | None

    @property
    def worker_end(self) -> float:
        return self.fetch_start + self.fetch_s + self.collate_s

    @property
    def making_s(self) -> float:
        return self.fetch_s + self.collate_s


def timed(batches: Iterable[BatchRecord]) -> list[TimedBatch]:
    """The batches whose making was timed (all of them, unless batches came fast: then a
    stated sample, probes.TIME_EVERY), with their figures typed as present."""
    return [TimedBatch(b.seq, b.worker_id, b.worker_pid, b.fetch_start, b.fetch_s, b.collate_s,
                       b.fetch_cpu_s, b.nbytes)
            for b in batches if b.fetch_s is not None and b.fetch_start is not None
            and b.collate_s is not None]


def timed_scale(batches: Sequence[BatchRecord], made: Sequence[TimedBatch],
                counts: Mapping[int, int] | None = None) -> dict[int, float]:
    """Per worker: its batches over its timed ones, to scale a sum over the timed batches up
    to all it made (1.0 where every batch was timed). ``counts``: each worker's batches where
    ``batches`` are not all of them (windows: analyse/batch_log.py)."""
    if counts is None:
        counts = {}
        for b in batches:
            counts[b.worker_id] = counts.get(b.worker_id, 0) + 1
    timed_counts: dict[int, int] = {}
    for t in made:
        timed_counts[t.worker_id] = timed_counts.get(t.worker_id, 0) + 1
    return {w: counts.get(w, n) / n for w, n in timed_counts.items()}


# A batch whose making was not timed: (worker_id, pid, samples), as the probes send it.
UntimedMeta = tuple[int, int, int]


class BatchMeta(NamedTuple):
    """Where and how a batch was made, as the probes send it with each batch
    (instrument/probes.py) and the ledger reads it. ``worker_id`` is -1 for the main process;
    ``probe`` rides only with the first batch of each process (see first_fetch.first_fetch_probe). The
    batch's size is measured in the worker too: that work stays off the main process."""

    worker_id: int
    pid: int
    fetch_start: float
    fetch_s: float
    collate_s: float
    fetch_cpu_s: float | None  # None on batches it was not read for (sampled)
    samples: int
    nbytes: int | None  # likewise
    probe: dict[str, Any] | None = None
