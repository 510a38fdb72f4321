"""A Thinner's batches (record/folding.py) in the forms it takes them, read as the numpy columns
a fold reads (NOTE [ Windows for fast loaders ]): rows here; a watched loop's batches as taken
in record/taken.py."""

from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple, Protocol, Sequence

import numpy as np

from dataloader_tuner.record.rows import BatchRecord

# A row's fields by position: a fold reads them as columns (RowForm.columns), not by name
SEQ, EPOCH, T_REQUEST, WAIT, STEP, SAMPLES = range(6)
WORKER = BatchRecord._fields.index("worker_id")
FETCH = BatchRecord._fields.index("fetch_s")
GAP = BatchRecord._fields.index("gpu_gap_ms")


class FoldColumns(NamedTuple):
    """Batches as columns, one entry a batch (numpy arrays): what a fold reads of each. Times
    are seconds since the run started; ``gap`` is NaN where the GPU's idle gap was not timed."""

    seq: np.ndarray
    epoch: np.ndarray
    start: np.ndarray  # t_request
    wait: np.ndarray
    step: np.ndarray
    samples: np.ndarray
    worker: np.ndarray
    timed: np.ndarray  # the batch's making was timed (its row is kept whole)
    gap: np.ndarray

    def take(self, index: np.ndarray | slice) -> "FoldColumns":
        return FoldColumns(*(column[index] for column in self))


def object_column(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """A column that may hold None: whether each is set, and the values as floats (NaN: None)."""
    held = np.array(values, dtype=object)
    present = np.not_equal(held, np.array(None, dtype=object))
    floats = np.full(len(values), np.nan)
    floats[present] = held[present].astype(float)
    return present, floats


class BatchForm(Protocol):
    """What a Thinner's batches are: rows (RowForm) or a watched loop's batches as taken
    (record/taken.TakenForm); read one at a time where one is enough, as columns to fold."""

    def seq(self, item: Any) -> int: ...

    def start(self, item: Any) -> float: ...

    def end(self, item: Any) -> float: ...

    def columns(self, items: Sequence[Any]) -> FoldColumns: ...

    def rows(self, items: Sequence[Any]) -> list[BatchRecord]: ...


class RowForm:
    """Batches as rows: BatchRecords, or the plain tuples of the pipe's JSON (its fields)."""

    @staticmethod
    def seq(row: Sequence[Any]) -> int:
        return row[SEQ]

    @staticmethod
    def start(row: Sequence[Any]) -> float:
        return row[T_REQUEST]

    @staticmethod
    def end(row: Sequence[Any]) -> float:
        """When its step ended (its t_ready + step_s), since the run started."""
        return row[T_REQUEST] + row[WAIT] + row[STEP]

    @staticmethod
    def columns(rows: Sequence[Sequence[Any]]) -> FoldColumns:
        n = len(rows)

        def column(index: int, kind: type) -> np.ndarray:
            return np.fromiter(map(itemgetter(index), rows), kind, n)

        timed, _ = object_column(list(map(itemgetter(FETCH), rows)))
        _, gaps = object_column(list(map(itemgetter(GAP), rows)))
        return FoldColumns(column(SEQ, np.int64), column(EPOCH, np.int64),
                           column(T_REQUEST, float), column(WAIT, float), column(STEP, float),
                           column(SAMPLES, np.int64), column(WORKER, np.int64), timed, gaps)

    @staticmethod
    def rows(rows: Sequence[Sequence[Any]]) -> list[BatchRecord]:
        return [BatchRecord.from_row(row) for row in rows]


ROWS = RowForm()
