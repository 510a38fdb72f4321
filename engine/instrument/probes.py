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

import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info
from torch.utils.data._utils.collate import default_collate, default_convert

from dataloader_tuner.instrument import sampler
from dataloader_tuner.instrument.first_fetch import first_fetch_probe, rng_state
from dataloader_tuner.instrument.stacks import offer_stack
from dataloader_tuner.instrument.tensors import (PY_SCALAR_BYTES, SAMPLES_RULE, WALK_BUDGET,
                                                WALK_LIST_SAMPLE, samples_in, sizes_of)
from dataloader_tuner.record.rows import BatchMeta, UntimedMeta

if TYPE_CHECKING:
    from dataloader_tuner.config import LoaderConfig

# CLOCK_MONOTONIC is system-wide on Linux, so worker and main-process timestamps compare.
clock = time.monotonic


def cpu_clock() -> float:
    """CPU time of this process (fetch CPU against fetch wall time tells CPU-bound from
    waiting), up to date for the calling thread.

    NOTE [ A fetch's CPU, read finely ]

        While a process-wide CPU timer is armed (the sampler's, instrument/cpu_timer.py, in
        the job's process), Linux reads the process's CPU clock from the timer's counter, which
        takes in a running thread's time only at the scheduler's ticks (4 ms here) and switches:
        tests/real/detection.py's 0.5 ms fetches at 0 workers read 0.0 or 3.999 ms, a median
        of 0.0, and the profile named "overlap the waits for storage" (x1.7) for a dataset held
        in memory. Reading the calling thread's own clock first brings the counter up to date
        with that thread's time (the kernel accounts the running task to read it): then 0.53 ms
        of CPU in 0.53 ms. The process's clock, not the thread's alone, is what a fetch's CPU
        is read from: the helper threads a fetch starts are its CPU too (tests/broken/
        thread_pools.py's pool of 8, a worker's oversubscription; torch's intra-op pool at 0
        workers: audio_mel's 517 ms fetches took 1,013 ms)."""
    thread_clock()
    return process_clock()


process_clock = time.process_time
thread_clock = time.thread_time


# Exceptions from the user's code get a note starting with this; failures.py reads it back
# from the exception (0 workers) or from the worker's traceback text (torch re-raises those).
NOTE_PREFIX = "[dataloader-tuner]"


def add_note(exc: BaseException, text: str) -> None:
    """Attach context to the user's exception without changing its type (Python 3.11+; on
    older Pythons the context is lost, the exception itself is not)."""
    if hasattr(exc, "add_note"):
        exc.add_note(f"{NOTE_PREFIX} {text}")


# The costly reads (the process CPU clock, the walk that sizes a batch) are read on every batch
# only while under READ_SHARE of its time, else on every n-th (why: record/ledger.py's
# NOTE [ Measuring cost on the fastest batches ]).
FAST_BATCH_S = 0.001  # batches faster than this read them on every SAMPLE_EVERY-th only
SAMPLE_EVERY = 16
READ_SHARE = 0.005
MAX_EVERY = 64  # the rarest they are read
# Fast batches' making (fetch, collate, worker) is timed on every TIME_EVERY-th batch of each
# process only, once it has timed its first TIME_ALL_FIRST (same NOTE); the others carry their
# sample count alone.
TIME_EVERY = SAMPLE_EVERY
TIME_ALL_FIRST = 64


class _FetchTimer:
    """Per-process record of the fetch since the last collate (one per worker process)."""

    __slots__ = ("start", "cpu_start", "total", "indices", "fetching", "pid", "probed", "probe",
                 "made", "every", "timed_every", "worker_id")

    def __init__(self) -> None:
        self.start: float | None = None
        self.cpu_start: float | None = None
        self.total = 0.0
        self.indices: Sequence[Any] | None = None  # the batch's: for hang and error reports
        self.fetching = False
        self.pid = os.getpid()
        self.probed = False  # this process's first fetch was probed (see first_fetch_probe)
        self.probe: dict[str, Any] | None = None
        self.made = 0  # batches this process made
        self.every = 1  # the costly reads happen on every n-th batch (see READ_SHARE)
        self.timed_every = 1  # the making is timed on every n-th batch (see TIME_EVERY)
        self.worker_id: int | None = None  # DataLoader's worker id (-1: main), once known

    def begin(self) -> float:
        """Called before each fetch; notes the CPU clock at the first fetch of a batch that
        reads it (the test is written out in TimedMapDataset too, for speed)."""
        if self.start is None and self.cpu_start is None and self.made % self.every == 0:
            self.cpu_start = cpu_clock()
        return clock()

    def read_every(self, batch_s: float, reads_s: float) -> int:
        """How often to read, after a batch of ``batch_s`` whose reads took ``reads_s``."""
        base = SAMPLE_EVERY if batch_s < FAST_BATCH_S else 1
        share = math.ceil(reads_s / (READ_SHARE * batch_s)) if batch_s > 0 else MAX_EVERY
        every = min(max(base, share), MAX_EVERY)
        # Read on timed batches only: a multiple of how often those come.
        return -(-every // self.timed_every) * self.timed_every

    def time_every(self, batch_s: float) -> int:
        """How often to time a batch's making, after a timed batch of ``batch_s``."""
        return TIME_EVERY if batch_s < FAST_BATCH_S and self.made >= TIME_ALL_FIRST else 1

    def add(self, start: float, end: float) -> None:
        if self.start is None:
            self.start = start
        self.total += end - start

    def first_fetch_here(self) -> bool:
        """True once per process (a forked worker starts afresh, see _after_fork), which then
        offers its stack to a hang report (offer_stack)."""
        if self.probed:
            return False
        self.probed = True
        offer_stack()
        sampler.start_if_asked()
        return True


_timer = _FetchTimer()  # each worker process gets its own


def _after_fork() -> None:
    # A forked worker inherits the parent's timer mid-state; spawn and forkserver workers
    # import this module afresh and need nothing.
    global _timer
    _timer = _FetchTimer()


os.register_at_fork(after_in_child=_after_fork)


def outstanding(iterator: Any) -> list[dict]:
    """The batches ``iterator`` was asked for and has not delivered, oldest first:
    ``[{worker_id, indices}]`` (indices where its batch sampler is a RecordingBatchSampler,
    else None). Read from another thread while the loop waits."""
    task_info = dict(getattr(iterator, "_task_info", {}) or {})
    if not task_info:  # no workers: the main process is inside the fetch itself
        indices = current_indices()
        return [{"worker_id": -1, "indices": indices}] if indices is not None else []
    batch_sampler = getattr(iterator, "_index_sampler", None)  # the loader's, as it iterates
    sent = batch_sampler.sent if isinstance(batch_sampler, RecordingBatchSampler) else {}
    waiting = sorted(k for k, info in task_info.items() if len(info) == 1)
    return [{"worker_id": task_info[k][0], "indices": _first_indices(sent.get(k))}
            for k in waiting]


def _first_indices(indices: Any) -> Any:
    return list(indices)[:64] if isinstance(indices, (list, tuple)) else indices


def current_indices() -> list | None:
    """The indices this process is fetching right now, if it is inside a fetch."""
    return list(_timer.indices)[:64] if _timer.fetching and _timer.indices is not None else None


class TimedMapDataset(Dataset):
    """A map-style dataset whose batch fetch is timed once per batch, not once per sample.

    Defining ``__getitems__`` makes DataLoader hand us the whole list of indices; we do what its
    fetcher would do (the inner ``__getitems__`` if present, else one ``__getitem__`` per index),
    so behaviour is unchanged and the cost is two clock reads per batch.
    """

    def __init__(self, inner: Dataset) -> None:
        # (and _tuner_fetch, (inner, its __getitems__): one look-up a batch, as this class's
        # __getattr__ makes each look-up on it dearer; __setattr__)
        self.inner = inner
        self.probe_first = True  # False: a worker's first fetch offers its stack only (see watcher)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # a map-style dataset: len() is its

    def __getitem__(self, index: Any) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list) -> list:
        # Written out here and in TimedCollate, not in methods (why: record/ledger.py's
        # NOTE [ Measuring cost on the fastest batches ]).
        timer = _timer
        if not timer.probed:  # the attribute, not the method, on every batch after the first
            timer.first_fetch_here()
            if not self.probe_first:
                return self.__getitems__(indices)
            before = rng_state(self.inner)
            items = self.__getitems__(indices)
            timer.probe = first_fetch_probe(before, rng_state(self.inner))
            return items
        timer.indices, timer.fetching = indices, True
        timed = timer.made % timer.timed_every == 0
        if timed:
            if (timer.start is None and timer.cpu_start is None  # the batch's first fetch
                    and timer.made % timer.every == 0):  # ...and it reads the costly figures
                timer.cpu_start = cpu_clock()
            start = clock()
        inner, inner_getitems = self._tuner_fetch
        if inner_getitems:
            try:
                items = inner_getitems(indices)
            except Exception as exc:
                add_note(exc, f"while fetching sample indices {list(indices)[:64]}")
                raise
        else:
            pending = iter(indices)
            try:  # a comprehension like torch's own fetcher: the cheapest loop there is
                items = [inner[i] for i in pending]
            except Exception as exc:
                add_note(exc, f"while fetching sample index {_failed_index(indices, pending)!r} "
                              f"(batch indices {list(indices)[:64]})")
                raise
        if timed:
            end = clock()
            if timer.start is None:
                timer.start = start
            timer.total += end - start
        timer.fetching = False
        return items

    def __getattr__(self, name: str) -> Any:
        # Samplers and user code sometimes read dataset attributes (targets, classes, ...).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # ...and set them: worker_init_fn gets this wrapper as get_worker_info().dataset and
        # must reach the user's dataset (e.g. giving each worker its own random generator).
        if name in ("inner", "_tuner_fetch", "probe_first"):
            object.__setattr__(self, name, value)
            if name == "inner":  # what each batch is fetched from, read in one look-up
                object.__setattr__(self, "_tuner_fetch",
                                   (value, getattr(value, "__getitems__", None)))
        else:
            setattr(self.inner, name, value)


def _failed_index(indices: Any, pending: Iterator[Any]) -> Any:
    """The index the fetch was at when the user's code raised: the one before those it had
    not reached. (Read from the iterator, not the traceback: Python 3.12 inlines comprehensions,
    and their variable is in no frame's locals after the raise.)"""
    left = sum(1 for _ in pending)
    try:
        return indices[len(indices) - left - 1]
    except (TypeError, IndexError):  # not a sequence: the index cannot be named
        return None


class TimedIterableDataset(IterableDataset):
    """An iterable dataset whose items are timed as the worker pulls them."""

    def __init__(self, inner: IterableDataset) -> None:
        self.inner = inner
        self.probe_first = True  # as TimedMapDataset's

    def __iter__(self):
        probing = _timer.first_fetch_here() and self.probe_first
        before = rng_state(self.inner) if probing else None
        yield from timed_items(iter(self.inner), self.inner, before)

    def __len__(self) -> int:
        # Raises TypeError like the original when there is no length.
        return len(self.inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("inner", "probe_first"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)


def timed_items(iterator: Iterator[Any], source: Any, before: dict[str, str] | None
                ) -> Iterator[Any]:
    """``iterator``'s items, each timed as the worker pulls it; ``before``: ``source``'s random
    generators before its first item, where this process's first fetch is probed (else None)."""
    timer = _timer
    count = 0
    while True:
        # Only the items of a batch whose making is timed (TIME_EVERY): the collate drops
        # the others' times unread. Its count does not move while its items are pulled.
        timed = timer.made % timer.timed_every == 0
        start = timer.begin() if timed else 0.0
        try:
            item = next(iterator)
        except StopIteration:
            return
        except Exception as exc:
            add_note(exc, f"while iterating, after {count} items from this process")
            raise
        if timed:
            timer.add(start, clock())
        if before is not None:
            timer.probe, before = first_fetch_probe(before, rng_state(source)), None
        count += 1
        yield item


class RecordingBatchSampler(Sampler):
    """Yields the inner batch sampler's batches and remembers the recent ones by position in
    the epoch (the position is the DataLoader iterator's send index). Main process only.
    ``in_flight``: the batches the loader keeps asked for (workers x prefetch_factor); a few
    times that are kept, so a large sequential batch list never piles up in a training job."""

    def __init__(self, inner: Iterable[Any], in_flight: int) -> None:
        self.inner = inner
        self.keep = 4 * max(in_flight, 1) + 16
        self.sent: dict[int, list] = {}

    def __iter__(self):
        sent = self.sent = {}
        for position, batch in enumerate(self.inner):
            sent[position] = batch
            sent.pop(position - self.keep, None)
            yield batch

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # as the wrapped sampler's own len()


class TimedCollate:
    """Wraps the user's collate function (or torch's default) and tags the batch."""

    def __init__(self, collate_fn: Callable | None, auto_collation: bool) -> None:
        self.collate_fn = collate_fn or (default_collate if auto_collation else default_convert)
        # With auto-batching the samples are the items the batch sampler's indices fetched
        # (len of the list collate gets): exact, whatever the collate returns.
        self.auto_collation = auto_collation

    def __call__(self, samples: Any) -> tuple[Any, BatchMeta | UntimedMeta]:
        timer = _timer
        if timer.made % timer.timed_every:  # not timed: who made it and its sample count
            try:
                batch = self.collate_fn(samples)
            except Exception as exc:
                self._failed(exc, samples)
                raise
            timer.made += 1
            return batch, (timer.worker_id, timer.pid,  # type: ignore[return-value]  # set
                           len(samples) if self.auto_collation else samples_in(batch))
        start = clock()
        # _FetchTimer.take, written out (see TimedMapDataset.__getitems__)
        fetch_start = timer.start if timer.start is not None else start
        fetch_s = timer.total
        fetch_cpu_s = cpu_clock() - timer.cpu_start if timer.cpu_start is not None else None
        timer.start = timer.cpu_start = None
        timer.total = 0.0
        try:
            batch = self.collate_fn(samples)
        except Exception as exc:
            self._failed(exc, samples)
            raise
        end = clock()
        counted = len(samples) if self.auto_collation else None
        timer.made += 1
        timer.timed_every = timer.time_every(end - fetch_start)
        if fetch_cpu_s is not None:  # a batch whose costly figures are read (see READ_SHARE)
            samples_n, nbytes = sizes_of(batch, counted)
            timer.every = timer.read_every(end - fetch_start, clock() - end)
        else:
            samples_n, nbytes = (counted if counted is not None else samples_in(batch)), None
        if timer.worker_id is None:  # once per process: DataLoader's worker id, -1 in main
            info = get_worker_info()
            timer.worker_id = -1 if info is None else info.id
        probe, timer.probe = timer.probe, None
        if probe is None and timer.worker_id >= 0:  # a worker's samples ride with its batch
            sampled = sampler.due(end)
            if sampled:
                probe = {"profile": sampled}
        # tuple.__new__: a NamedTuple's own constructor is a Python function, 4x slower.
        return batch, tuple.__new__(BatchMeta, (
            timer.worker_id, timer.pid, fetch_start, fetch_s, end - start, fetch_cpu_s,
            samples_n, nbytes, probe))

    @staticmethod
    def _failed(exc: Exception, samples: Any) -> None:
        """Note on the user's collate error which batch it was and what did not match."""
        mismatch = shape_mismatch(samples) if isinstance(samples, list) else None
        indices = _timer.indices
        where = f"batch indices {list(indices)[:64]}" if indices else "a batch"
        add_note(exc, f"in collate_fn for {where}" + (f"; {mismatch}" if mismatch else ""))


def timed_collate(collate_fn: Callable | None, auto_collation: bool
                  ) -> Callable[[Any], tuple[Any, BatchMeta | UntimedMeta]]:
    """The collate function a probed loader gets: a TimedCollate's bound ``__call__``, which
    Python calls for half what it takes to call the instance (~50 against ~120 ns a batch),
    and which pickles (spawned workers) as the instance does."""
    return TimedCollate(collate_fn, auto_collation).__call__


def shape_mismatch(samples: list) -> str | None:
    """Which field of the samples has tensors of different shapes, e.g. "field 1: shapes
    (3, 4) at sample 0 and (5, 4) at sample 2", or None."""
    def fields(sample: Any, prefix: str = "") -> dict[str, Any]:
        if hasattr(sample, "shape") and hasattr(sample, "dtype"):
            return {prefix or "the sample": tuple(sample.shape)}
        out: dict[str, Any] = {}
        if isinstance(sample, dict):
            for key, value in sample.items():
                out.update(fields(value, f"{prefix}[{key!r}]" if prefix else f"field {key!r}"))
        elif isinstance(sample, (list, tuple)):
            for i, value in enumerate(sample):
                out.update(fields(value, f"{prefix}[{i}]" if prefix else f"field {i}"))
        return out

    first = fields(samples[0]) if samples else {}
    for position, sample in enumerate(samples[1:], start=1):
        for name, shape in fields(sample).items():
            if name in first and first[name] != shape:
                return (f"{name}: shapes {first[name]} at sample 0 and {shape} at sample "
                        f"{position} of the batch")
    return None


def wrap_dataset(dataset: Dataset) -> Dataset:
    if isinstance(dataset, IterableDataset):
        return TimedIterableDataset(dataset)
    return TimedMapDataset(dataset)


def counting_rules(config: "LoaderConfig") -> dict:
    """How each per-batch figure is counted, for the output to say (see probes.py)."""
    batched = config.batch_size is not None or config.batch_sampler is not None
    return {
        "samples": ("exact: the number of items the batch sampler's indices fetched" if batched
                    else SAMPLES_RULE),
        "bytes": (f"tensor and array data, bytes and str, {PY_SCALAR_BYTES} bytes per Python "
                  f"number; at most {WALK_BUDGET} objects are visited per batch and long lists "
                  f"are sampled ({WALK_LIST_SAMPLE} items, scaled up)"),
        "reads": (f"sampled, to keep measuring cheap: on every {SAMPLE_EVERY}th batch when a "
                  f"batch takes under {FAST_BATCH_S * 1000:g} ms to make, and rarer when reading "
                  f"a batch's bytes costs over {READ_SHARE:.1%} of its time"),
        "making": (f"fetch and collate are timed where each batch is made; batches that take "
                   f"under {FAST_BATCH_S * 1000:g} ms are timed on each process's first "
                   f"{TIME_ALL_FIRST} and every {TIME_EVERY}th after, and each worker's busy "
                   f"share is scaled up from the batches it timed"),
    }
