"""Timing probes that run inside DataLoader workers, by wrapping (torch is never patched).

The dataset is wrapped so each worker notes when it started fetching a batch and how long the
fetch took; the collate function is wrapped so it adds the collate time and returns
``(batch, BatchMeta)``. The main process unwraps that pair right after ``next()``.

Why the meta rides with the batch instead of a side queue: it is the only way to know for
certain which worker produced which batch (with ``in_order=False`` or an exhausted iterable
worker, round-robin guesses are wrong), it costs one small tuple per batch, and it needs no
extra process-crossing channel that could itself block or leak.

Classes here live at module scope so spawn/forkserver workers can unpickle them by name.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, NamedTuple

from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate, default_convert

# CLOCK_MONOTONIC is system-wide on Linux, so worker and main-process timestamps compare.
clock = time.monotonic
# CPU time of this process: fetch CPU vs fetch wall time tells CPU-bound from waiting.
cpu_clock = time.process_time


class BatchMeta(NamedTuple):
    """Where and how a batch was made. ``worker_id`` is -1 for the main process."""

    worker_id: int
    pid: int
    fetch_start: float
    fetch_s: float
    collate_s: float
    fetch_cpu_s: float


class _FetchTimer:
    """Per-process record of the fetch since the last collate (one per worker process)."""

    __slots__ = ("start", "cpu_start", "total")

    def __init__(self) -> None:
        self.start = None
        self.cpu_start = None
        self.total = 0.0

    def begin(self) -> float:
        """Called before each fetch; notes the CPU clock at the batch's first fetch."""
        if self.start is None and self.cpu_start is None:
            self.cpu_start = cpu_clock()
        return clock()

    def add(self, start: float, end: float) -> None:
        if self.start is None:
            self.start = start
        self.total += end - start

    def take(self, now: float) -> tuple[float, float, float]:
        start, total = (self.start if self.start is not None else now), self.total
        cpu = cpu_clock() - self.cpu_start if self.cpu_start is not None else 0.0
        self.start, self.cpu_start, self.total = None, None, 0.0
        return start, total, cpu


_timer = _FetchTimer()  # each worker process gets its own copy


class TimedMapDataset(Dataset):
    """A map-style dataset whose batch fetch is timed once per batch, not once per sample.

    Defining ``__getitems__`` makes DataLoader hand us the whole list of indices; we do what its
    fetcher would do (the inner ``__getitems__`` if present, else one ``__getitem__`` per index),
    so behaviour is unchanged and the cost is two clock reads per batch.
    """

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner
        self._inner_getitems = getattr(inner, "__getitems__", None)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: Any) -> Any:
        start = _timer.begin()
        item = self.inner[index]
        _timer.add(start, clock())
        return item

    def __getitems__(self, indices: list) -> list:
        start = _timer.begin()
        if self._inner_getitems:
            items = self._inner_getitems(indices)
        else:
            inner = self.inner
            items = [inner[i] for i in indices]
        _timer.add(start, clock())
        return items

    def __getattr__(self, name: str) -> Any:
        # Samplers and user code sometimes read dataset attributes (targets, classes, ...).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class TimedIterableDataset(IterableDataset):
    """An iterable dataset whose items are timed as the worker pulls them."""

    def __init__(self, inner: IterableDataset) -> None:
        self.inner = inner

    def __iter__(self):
        iterator = iter(self.inner)
        begin, add = _timer.begin, _timer.add
        while True:
            start = begin()
            try:
                item = next(iterator)
            except StopIteration:
                return
            add(start, clock())
            yield item

    def __len__(self) -> int:
        return len(self.inner)  # raises TypeError like the original when there is no length


class TimedCollate:
    """Wraps the user's collate function (or torch's default) and tags the batch."""

    def __init__(self, collate_fn: Callable | None, auto_collation: bool) -> None:
        self.collate_fn = collate_fn or (default_collate if auto_collation else default_convert)

    def __call__(self, samples: Any) -> tuple[Any, BatchMeta]:
        fetch_start, fetch_s, fetch_cpu_s = _timer.take(clock())
        start = clock()
        batch = self.collate_fn(samples)
        collate_s = clock() - start
        info = get_worker_info()
        worker_id = info.id if info is not None else -1
        return batch, BatchMeta(worker_id, os.getpid(), fetch_start, fetch_s, collate_s,
                                fetch_cpu_s)


def wrap_dataset(dataset: Dataset) -> Dataset:
    if isinstance(dataset, IterableDataset):
        return TimedIterableDataset(dataset)
    return TimedMapDataset(dataset)


def batch_size_of(batch: Any) -> int:
    """Samples in a collated batch: the leading dimension of its first tensor or array."""
    found = _first_array(batch)
    if found is not None and getattr(found, "ndim", 0) > 0:
        return int(found.shape[0])
    if isinstance(batch, (list, tuple)) and batch and not isinstance(batch[0], (int, float)):
        return len(batch)
    return 1


def nbytes_of(batch: Any) -> int:
    """Bytes of tensor/array payload in a batch (the part that travels through /dev/shm)."""
    if hasattr(batch, "element_size") and hasattr(batch, "nelement"):
        return batch.element_size() * batch.nelement()
    if hasattr(batch, "nbytes") and not isinstance(batch, (bytes, bytearray)):
        return int(batch.nbytes)
    if isinstance(batch, dict):
        return sum(nbytes_of(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(nbytes_of(v) for v in batch)
    if isinstance(batch, (bytes, bytearray, str)):
        return len(batch)
    return 0


def _first_array(batch: Any) -> Any:
    if hasattr(batch, "shape"):
        return batch
    if isinstance(batch, dict):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        return None
    for value in values:
        found = _first_array(value)
        if found is not None:
            return found
    return None
