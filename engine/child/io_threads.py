"""Threads for waiting I/O, measured: the pick's settings with each batch's samples fetched by
a few threads in each worker (or in the main process at num_workers=0), against the same
settings as they are. Where the sampled profile says the fetch mostly waits (remote storage,
a slow disk: pytorch#158218, S3 2.32 -> 1.02 s an iteration with threads), its waits overlap.
A trial, not the job: the samples and their order are the dataset's own, what the model sees
is untouched (NOTE [ The ceiling and what would raise it ], analyse/ceiling.py)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from dataloader_tuner.child.trial_run import TrialRunner
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.plan import IO_THREAD_TRIALS

_OWN = ("inner", "threads", "_pool", "_pid")  # ThreadedFetch's own attributes


class ThreadedFetch(Dataset):
    """The dataset, each batch's samples fetched by ``threads`` threads, in the batch's order
    (torch's fetcher calls ``__getitems__`` with a batch's indices). The pool is made in the
    process that fetches (a forked worker does not inherit a parent's threads) and ends with
    it, or at ``close()`` in this process."""

    def __init__(self, inner: Any, threads: int) -> None:
        self.inner, self.threads = inner, threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        return self.inner[index]

    def __getitems__(self, indices: list) -> list:
        if self._pid != os.getpid():  # first here, or a worker forked with the parent's object
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="io-thread")
            self._pid = os.getpid()
        assert self._pool is not None
        return list(self._pool.map(self.inner.__getitem__, indices))

    def __getattr__(self, name: str) -> Any:
        # (a worker_init_fn or a sampler reading the dataset's attributes reaches it; not
        # the special names copy and pickle look up, which are this object's)
        if name in _OWN or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # (a worker_init_fn opening a file on get_worker_info().dataset: the dataset's)
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def __getstate__(self) -> dict[str, Any]:  # (spawned workers: no pool travels)
        return {**self.__dict__, "_pool": None, "_pid": None}

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = self._pid = None


def own_batched_fetch(dataset: Any) -> bool:
    """The dataset fetches a batch at once in a ``__getitems__`` of its own (torch's Subset's
    only passes the indices on: fetched one by one, it makes the same samples)."""
    getitems = getattr(type(dataset), "__getitems__", None)
    return getitems is not None and not getattr(getitems, "__module__", "").startswith("torch.")


def measure_threaded(runner: TrialRunner, config: LoaderConfig, threads: int
                     ) -> list[TrialResult] | None:
    """IO_THREAD_TRIALS trials of ``config`` with ``threads`` fetching threads per process, or
    None where the dataset does not allow it (iterable, its own batched ``__getitems__``) or
    a trial failed (a dataset that is not safe to read from threads: the tune keeps its pick
    and claims nothing of threads)."""
    dataset = runner.resolved.dataset
    if isinstance(dataset, IterableDataset) or own_batched_fetch(dataset) or not config.batch_size:
        return None
    threaded = ThreadedFetch(dataset, threads)
    with_threads = TrialRunner(replace(runner.resolved, dataset=threaded), runner.consumer,
                               lambda t: None, runner.time_limit)
    try:
        trials = [with_threads.measure(config, "io_threads", repeat, report=False)
                  for repeat in range(IO_THREAD_TRIALS)]
    except Exception:  # noqa: BLE001 - the user's dataset under threads: a measurement lost
        return None
    finally:
        threaded.close()
    kept = [t for t in trials if t is not None]
    return kept or None
