"""Hand-made batch records for tests of pure functions (charts, traces, metrics)."""

from dataloader_tuner.record.columns import BatchColumns
from dataloader_tuner.record.rows import BatchRecord


def make_batches(n: int, workers: int = 2, period_s: float = 0.01, wait_s: float = 0.002,
                 fetch_s: float = 0.015, collate_s: float = 0.001, h2d_ms=None,
                 gpu_gap_ms=None) -> list[BatchRecord]:
    """``n`` batches, round-robin over ``workers`` (0: the main process), one every
    ``period_s``."""
    batches = []
    for i in range(n):
        t = i * period_s
        worker = i % workers if workers else -1
        batches.append(BatchRecord(
            seq=i, epoch=0, t_request=t, wait_s=wait_s, step_s=period_s - wait_s, samples=8,
            nbytes=4096, worker_id=worker, worker_pid=500 + worker if workers else 400,
            fetch_start=max(t - fetch_s, 0.0), fetch_s=fetch_s, collate_s=collate_s,
            fetch_cpu_s=fetch_s * 0.9, h2d_ms=h2d_ms, h2d_other_ms=None if h2d_ms is None else
            h2d_ms * 2, gpu_gap_ms=gpu_gap_ms))
    return batches


def columns_of(rows: list[BatchRecord], t0: float = 100.0) -> BatchColumns:
    """The columns the engine's loop would have written for ``rows`` (record/columns.py), its
    clock started at ``t0``."""
    columns = BatchColumns(t0, rows[0].seq if rows else 0)
    epoch = None
    for row in rows:
        if row.epoch != epoch:
            columns.epochs.append((row.seq, row.epoch))
            epoch = row.epoch
        t_request = t0 + row.t_request
        columns.clocks.extend([t_request, t_request + row.wait_s,
                               t_request + row.wait_s + row.step_s])
        if row.fetch_s is None:
            columns.metas.append((row.worker_id, row.worker_pid, row.samples))
        else:
            columns.metas.append((row.worker_id, row.worker_pid, row.fetch_start + t0, row.fetch_s,
                                  row.collate_s, row.fetch_cpu_s, row.samples, row.nbytes))
        if (row.h2d_ms, row.h2d_other_ms, row.gpu_gap_ms) != (None, None, None):
            columns.step_times[row.seq] = (row.h2d_ms, row.h2d_other_ms, row.gpu_gap_ms)
    return columns


def to_the_microsecond(row: tuple) -> tuple:
    """A batch row as the history gives it back: each time rounded to its microsecond
    (NOTE [ A history's rows, kept small ])."""
    from dataloader_tuner.record.rows import BATCH_COLUMNS
    from dataloader_tuner.store.compact import STORED_SCALE

    return tuple(v if v is None or c not in STORED_SCALE else round(v * STORED_SCALE[c])
                 / STORED_SCALE[c] for c, v in zip(BATCH_COLUMNS, row))
