"""A worker whose private memory keeps rising after warm-up: a cache or list filling in each
worker, or copy-on-read of the Python objects the dataset holds (its pages turn private while
RSS stays flat). A pitfall (pitfalls.py) of its own module: the rule and the traces that set
its numbers take a page.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from dataloader_tuner.analyse.diagnostic import Diagnostic

# Worker memory growth is judged on each worker's private dirty memory (USS where that is not
# read), sampled every ~2 s; RSS alone never flags. Traces of real shapes (2 workers, this
# machine) set the numbers: copy-on-read of a 2M-dict list rose 4.7 MB/s for 40 s, RSS flat;
# JPEG decoding +2 MB in 25 s; np.memmap reads: RSS +2 GB and USS +260 MB in 2 s (file pages
# one worker maps alone), dirty memory flat; a shuffle buffer +320 MB in 7 s, then flat.
LEAK_WARMUP_S = 2.0  # a worker's first seconds fill pools, caches and buffers: not judged
LEAK_MIN_SPAN_S = 8.0  # a shorter rise cannot be told from a buffer filling up
LEAK_MIN_SAMPLES = 5
# Each half of the judged samples gains this much (fitted line): the healthy workers gained
# < 3 MB per half once warm, the leaks 20-230 MB; a one-time allocation lands in one half only.
LEAK_HALF_MB = 10.0
LEAK_KEEP_RATE = 1 / 3  # the last half at a third of the first half's rate or more: no plateau
# RSS rising less than half as much as private memory: pages the worker already had (shared
# with the parent) turning private, i.e. copy-on-read. A buffer or cache filling up adds pages
# to RSS instead. Copy-on-read is flagged even as it slows down: it ends only when each worker
# holds its own copy of every object the dataset has.
RSS_FLAT_SHARE = 0.5


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over t."""
    mean_t = statistics.fmean(t for t, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var if var else 0.0


SERIALIZE_FIX = """import pickle
import numpy as np

class SerializedList:
    \"\"\"A list of Python objects kept as one numpy byte buffer (detectron2's
    DatasetFromList(serialize=True)): workers read it without copying pages.\"\"\"

    def __init__(self, records):
        blobs = [np.frombuffer(pickle.dumps(r, protocol=-1), dtype=np.uint8) for r in records]
        self._ends = np.cumsum([len(b) for b in blobs], dtype=np.int64)
        self._data = np.concatenate(blobs) if blobs else np.zeros(0, dtype=np.uint8)

    def __len__(self):
        return len(self._ends)

    def __getitem__(self, i):
        start = int(self._ends[i - 1]) if i > 0 else 0
        return pickle.loads(memoryview(self._data[start:int(self._ends[i])]))

# in the dataset's __init__, instead of self.records = records (a list of dicts):
# self.records = SerializedList(records)"""

CACHE_FIX = """# Keep nothing per sample in the dataset object: each worker fills its own copy.
# If a cache pays, bound it:
import functools

@functools.lru_cache(maxsize=256)
def load(index): ...
# or precompute the samples once into a numpy array / np.memmap file before the
# DataLoader starts: every worker then reads the same pages."""


def _private_growth(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A worker's private memory trend after warm-up, or None when it is not a lasting rise.

    Judged on dirty memory (written pages) where sampled, else USS: USS also counts clean file
    pages (mmap, LMDB) that only this worker maps, which are reclaimable, not a leak."""
    key = "dirty_mb" if any(r.get("dirty_mb") is not None for r in rows) else "uss_mb"
    # The warm-up from the worker's first row, read or not: its memory is read from
    # ResourceSampler.USS_MIN_AGE_S on, which is no reason to wait longer.
    born = rows[0]["t"] if rows else 0.0
    rows = [r for r in rows if r.get(key) is not None and r["t"] >= born + LEAK_WARMUP_S]
    if len(rows) < LEAK_MIN_SAMPLES or rows[-1]["t"] - rows[0]["t"] < LEAK_MIN_SPAN_S:
        return None
    n = len(rows)
    first, last = rows[:(n + 1) // 2], rows[n // 2:]  # an odd middle sample is in both
    early, late = (_slope([(r["t"], r[key]) for r in half]) for half in (first, last))
    gains = (early * (first[-1]["t"] - first[0]["t"]), late * (last[-1]["t"] - last[0]["t"]))
    start, end = rows[0], rows[-1]
    rss_gain = (end.get("rss_mb") or 0) - (start.get("rss_mb") or 0)
    copy_on_read = rss_gain < RSS_FLAT_SHARE * (end[key] - start[key])
    if min(gains) < LEAK_HALF_MB or (late < LEAK_KEEP_RATE * early and not copy_on_read):
        return None
    return {"worker_id": next((r["worker_id"] for r in reversed(rows)
                               if r.get("worker_id") is not None), None),
            "pid": end["pid"], "measure": key.removesuffix("_mb"),
            "start_mb": round(start[key]), "end_mb": round(end[key]),
            "uss_start_mb": _round(start.get("uss_mb")), "uss_end_mb": _round(end.get("uss_mb")),
            "mb_per_min": round(late * 60, 1), "over_s": round(end["t"] - start["t"], 1),
            "rss_start_mb": _round(start.get("rss_mb")), "rss_end_mb": _round(end.get("rss_mb")),
            "copy_on_read": copy_on_read}


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


def worker_memory_growth(resources: Sequence[dict[str, Any]]) -> list[Diagnostic]:
    """Workers whose private memory keeps rising after warm-up, without levelling off."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for row in resources:
        if row["role"] == "worker":
            by_pid.setdefault(row["pid"], []).append(row)
    grew = [g for g in map(_private_growth, by_pid.values()) if g is not None]
    if not grew:
        return []
    worst = max(grew, key=lambda g: g["mb_per_min"])
    copy_on_read = worst["copy_on_read"]
    head = (f"Worker private memory keeps growing: worker {worst['worker_id']}'s went from "
            f"{worst['start_mb']} to {worst['end_mb']} MB over {worst['over_s']} s after warm-up "
            f"({worst['mb_per_min']} MB/min in the last half) while its RSS went "
            f"{worst['rss_start_mb']} -> {worst['rss_end_mb']} MB; {len(grew)} worker(s) in all. ")
    if copy_on_read:
        message = head + (
            "RSS stays flat because these pages were already counted as shared with the parent: "
            "this is copy-on-read. Each read of a Python object the dataset holds (a list of "
            "dicts, strings) writes its reference count, which copies the page into that "
            "worker, so every worker ends up with its own copy and long runs end in the "
            "out-of-memory killer. Keep such lists serialized in one numpy buffer.")
    else:
        message = head + (
            "RSS grows with it: the dataset keeps what it loads in each worker (a cache of "
            "samples, a list appended to), and long runs end in the out-of-memory killer.")
    return [Diagnostic("worker_memory_growth", "warning", message,
                       {"workers": grew, "copy_on_read": copy_on_read},
                       SERIALIZE_FIX if copy_on_read else CACHE_FIX)]
