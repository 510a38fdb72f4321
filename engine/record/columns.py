"""Batches recorded in columns: what the engine's own measuring loop writes per batch, so that
the loop does as little as a plain loop does, and every row is still there, exact.

NOTE [ Rows built off the loop ]

    A plain loop over 45-65 us batches (tests/real/long_tail.py, many_classes.py) made ~13%
    more batches a second than the same loop building a ``BatchRecord`` per batch: the row's
    16 fields and 5 subtractions, the ledger's calls, the source's hooks, ~5-6 us a batch in
    one process (2-core machine). Here the loop keeps only what it measured: three clock
    readings in a list (an ``array('d')`` parses each float it takes: ~900 instructions a
    batch more, bench/instructions.py) and the meta the batch came with (a tuple the probes
    made anyway), ~0.5 us a batch. The rows are built from these columns where nobody waits for
    them: in the parent process for a profile run's pipe (``to_wire``/``rows_from_wire``), and
    after a trial's batches for a tune. Figures that a trial needs while it runs (its rate's
    interval) are read from the columns directly.
"""

from __future__ import annotations

import base64
import marshal
import struct
from array import array
from typing import Any, Sequence

from dataloader_tuner.record.rows import BatchMeta, BatchRecord, UntimedMeta
from dataloader_tuner.record.taken import NO_STEP_TIMES, rows_of_taken

TIMED_FIELDS = 8  # a timed meta's fields kept in the columns (BatchMeta without its probe)
SAMPLES_UNTIMED, SAMPLES_TIMED = 2, BatchMeta._fields.index("samples")


def samples_of_meta(meta: Sequence[Any]) -> int:
    """A column meta's sample count: ``(worker_id, pid, samples)`` or a timed meta's."""
    return meta[SAMPLES_UNTIMED] if len(meta) == 3 else meta[SAMPLES_TIMED]


def column_meta(meta: BatchMeta | UntimedMeta) -> tuple:
    """The meta as the columns keep it: a plain tuple (marshal writes no tuple subclass), a
    timed one without its probe (that went to ``on_worker`` already)."""
    return meta if meta.__class__ is tuple else tuple(meta[:TIMED_FIELDS])


class BatchColumns:
    """The batches of one measurement, numbered from ``first_seq``: per batch its three clock
    readings (``time.monotonic``: asked for, handed over, the loop back for the next) in
    ``clocks`` and its meta in ``metas``; aside, ``epochs`` as ``(seq, epoch)`` where an epoch's
    batches begin, and ``step_times[seq]`` where a GPU step was timed. ``t0``: when the
    measurement started, the rows' zero.

    The measuring loop only appends (clocks first, the meta last), so another thread may read
    the batches whose meta is in (``peek``) and ``drop`` them once written."""

    __slots__ = ("t0", "first_seq", "clocks", "metas", "epochs", "step_times")

    def __init__(self, t0: float = 0.0, first_seq: int = 0) -> None:
        self.t0, self.first_seq = t0, first_seq
        self.clocks: list[float] = []
        self.metas: list[tuple] = []
        self.epochs: list[tuple[int, int]] = []
        self.step_times: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self.metas)

    # -- read while the loop runs -------------------------------------------------------------

    def t_ready(self, index: int) -> float:
        """When batch ``index`` (of these columns) was handed over, since ``t0``."""
        return self.clocks[3 * index + 1] - self.t0

    def ends(self, start: int, stop: int) -> list[float]:
        """When the loop came back after each batch ``start..stop-1`` (its step's end)."""
        return self.clocks[3 * start + 2:3 * stop:3]

    def samples(self, start: int, stop: int) -> list[int]:
        return [samples_of_meta(meta) for meta in self.metas[start:stop]]

    def epoch_lengths(self, start: int) -> list[int]:
        """Batches in each epoch from batch ``start`` on (the first and last maybe cut)."""
        n = len(self.metas)
        begins = [seq - self.first_seq for seq, _ in self.epochs]
        cuts = [start] + [b for b in begins if start < b < n] + [n]
        return [hi - lo for lo, hi in zip(cuts, cuts[1:]) if hi > lo]

    def batch_seconds(self, most: int) -> list[float]:
        """Up to ``most`` batches' wait plus step, spread over those held (a stall watch's
        usual time)."""
        n = len(self.metas)
        step = max(1, n // most)
        clocks = self.clocks
        return [clocks[3 * i + 2] - clocks[3 * i] for i in range(0, n, step)]

    # -- rows -----------------------------------------------------------------------------------

    def rows(self) -> list[BatchRecord]:
        """Every batch's row, as the ledger builds one (record/ledger.BatchLedger.row)."""
        n = len(self.metas)
        return rows_of(self.t0, self.first_seq, self.clocks[:3 * n], self.metas[:n],
                       self.epochs, self.step_times)

    # -- handed to another thread -----------------------------------------------------------------

    def peek(self) -> "BatchColumns":
        """A copy of the batches held now (their meta is in: so are their clocks)."""
        n = len(self.metas)
        copy = BatchColumns(self.t0, self.first_seq)
        copy.metas = self.metas[:n]
        copy.clocks = self.clocks[:3 * n]
        last = self.first_seq + n
        copy.epochs = [e for e in self.epochs[:] if e[0] < last]
        copy.step_times = {s: t for s, t in list(self.step_times.items()) if s < last}
        return copy

    def drop(self, n: int) -> None:
        """The first ``n`` batches are written: forget them (the loop may append meanwhile)."""
        del self.metas[:n]
        del self.clocks[:3 * n]
        self.first_seq += n
        first = self.first_seq
        # The epoch a batch belongs to is the last begun at or before it: keep that one. The
        # loop appends epochs (in order) and step times meanwhile, so the old ones are deleted
        # in place, never the lists replaced, and the dict is read through a copy of its keys.
        begun = sum(1 for e in self.epochs[:] if e[0] <= first)
        del self.epochs[:max(begun - 1, 0)]
        for seq in [s for s in list(self.step_times) if s < first]:
            del self.step_times[seq]

    # -- the pipe -------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The batches for the pipe: the clocks' bytes and the marshalled metas (C speed, in
        the child; NOTE [ Rows built off the loop ])."""
        return {"n": len(self.metas), "t0": self.t0, "first_seq": self.first_seq,
                "clocks": base64.b64encode(struct.pack(f"{len(self.clocks)}d", *self.clocks)
                                           ).decode("ascii"),
                "metas": base64.b64encode(marshal.dumps(self.metas)).decode("ascii"),
                "epochs": self.epochs, "steps": [[s, *t] for s, t in self.step_times.items()]}


def rows_from_wire(doc: dict[str, Any]) -> list[BatchRecord]:
    """The rows ``BatchColumns.to_wire`` stands for, as plain tuples (in the parent)."""
    clocks = array("d")
    clocks.frombytes(base64.b64decode(doc["clocks"]))
    metas = marshal.loads(base64.b64decode(doc["metas"]))
    if len(clocks) != 3 * len(metas):
        raise ValueError(f"batch columns with {len(clocks)} clock readings for {len(metas)} "
                         f"batches: the child and parent run different engine code")
    return rows_of(doc["t0"], doc["first_seq"], clocks, metas,
                   [(int(s), int(e)) for s, e in doc["epochs"]],
                   {int(s): (h, o, g) for s, h, o, g in doc["steps"]})


def rows_of(t0: float, first_seq: int, clocks: Sequence[float], metas: Sequence[tuple],
            epochs: Sequence[tuple[int, int]], step_times: dict[int, tuple]
            ) -> list[BatchRecord]:
    """Rows from columns, built as a watched loop's batches are (taken.rows_of_taken: the
    parent builds ~10,000 a second for a fast loader)."""
    starts = sorted(epochs)
    epoch, at = (starts[0][1] if starts else 0), 0
    taken = []
    for i, meta in enumerate(metas):
        seq = first_seq + i
        while at < len(starts) and starts[at][0] <= seq:
            epoch, at = starts[at][1], at + 1
        taken.append((seq, epoch, clocks[3 * i], clocks[3 * i + 1], clocks[3 * i + 2], meta,
                      step_times.get(seq, NO_STEP_TIMES)))
    return rows_of_taken(t0, taken)
