"""/dev/shm against the batches in flight: a run's worst moment, and a check before any batch is
made (the dashboard's settings, a run about to start)."""

from __future__ import annotations

from typing import Any

from dataloader_tuner.analyse import pitfalls
from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.record.cards import DatasetCard


def shm_check(config: dict[str, Any], dataset: DatasetCard | None, shm: dict[str, Any] | None,
              ranks: int = 1, batch_bytes: float | None = None, in_use: bool = False
              ) -> list[Diagnostic]:
    """/dev/shm against the batches these settings keep in flight: from the batches measured,
    or before any is made from sample 0 (a run about to start, the dashboard's settings).
    ``in_use``: ``shm`` was read during the run, these batches in it."""
    workers = config.get("num_workers") or 0
    prefetch = config.get("prefetch_factor") or (2 if workers else 0)
    estimated = batch_bytes is None
    if estimated:
        batch_bytes = expected_batch_bytes(dataset, config)
    return pitfalls.shm_pressure(workers, prefetch, batch_bytes, shm, ranks, estimated, in_use)


def tightest_shm(resources: list[dict[str, Any]], at_start: dict[str, Any] | None
                 ) -> dict[str, Any] | None:
    """/dev/shm at its fullest in the run's resource samples (their main process's rows), in
    shm_usage's form (the rehearsed size kept from the start), or None before one is taken:
    space taken while the run goes on (another job, leaked segments) is judged as it climbs,
    and a run that came close is told so after it has passed."""
    fullest = max((row for row in resources
                   if row.get("role") == "main" and row.get("shm_total_mb")),
                  key=lambda row: row["shm_used_mb"] or 0.0, default=None)
    if fullest is None:
        return None
    used, total = fullest["shm_used_mb"] or 0.0, fullest["shm_total_mb"]
    return {"used_mb": used, "total_mb": total, "free_mb": max(total - used, 0.0),
            "rehearsed": bool(at_start and at_start.get("rehearsed"))}


def expected_batch_bytes(dataset: DatasetCard | None, config: dict[str, Any]) -> float | None:
    """A batch's bytes before any is made: sample 0's times the batch size (a dataset that
    yields whole batches, batch_size=None, yields one per item), or None when not known."""
    if dataset is None or not dataset.sample_bytes or "batch_sampler" in config:
        return None  # (a batch sampler's batch size is its own)
    if "batch_size" in config and config["batch_size"] is None:
        return float(dataset.sample_bytes)
    return float(dataset.sample_bytes) * (config.get("batch_size") or 1)
