"""Hand-made batch records for tests of pure functions (charts, traces, metrics)."""

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
