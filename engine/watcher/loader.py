"""``watch(loader)``: the user's own training loop, measured as the engine measures a run.

    loader = watch(DataLoader(dataset, batch_size=64, num_workers=4), name="train")
    for epoch in range(epochs):
        for batch in loader:      # unchanged
            ...

Per batch, in the training thread: the wait in ``next()`` (the input wait the GPU sees), the
step (from handing the batch over to the next ``next()``: the real model's time), samples and,
where the loader could be rebuilt with probes (rebuild.py), which worker made it and its fetch,
collate and CPU time. That is three clock reads, one tuple and one list append: the cost is
measured by bench/watch_overhead.py. Everything else (writing, resource samples) happens on the
recorder's thread.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from engine import protocol, system
from engine.child.probes import counting_rules, samples_in
from engine.config import LoaderConfig
from engine.errors import RunError
from engine.run.store import RunStore
from engine.watcher.rebuild import config_of, instrumented
from engine.watcher.recorder import Recorder, process_identity

UNKNOWN_WORKER = -2  # a batch of a loader that could not be probed: its worker is not known
_watched: list["WatchedLoader"] = []  # ended at exit, in order


def watch(loader: DataLoader, name: str | None = None, db: str | None = None) -> "WatchedLoader":
    """Wrap ``loader`` so every batch the training loop takes is measured and saved to the run
    history (``db``, default: the dashboard's), where the dashboard shows it live."""
    return WatchedLoader(loader, name, RunStore(db))


class WatchedLoader:
    """Iterates like the loader it wraps (``len``, epochs, ``loader.sampler.set_epoch``, any
    attribute): the batches are the loader's own, in its order."""

    def __init__(self, loader: DataLoader, name: str | None, store: RunStore) -> None:
        self.loader = loader
        self.name = name or "loader"
        self.probed, self.unprobed_reason = instrumented(loader)
        self.config = _config(loader)
        who = process_identity()
        self.t0 = time.monotonic()
        run_id = store.create_run("watch", who["script"], self.config.to_json_dict(),
                                  label=self.name, script=who["script"])
        self.recorder = Recorder(store, run_id, self.t0)
        self.recorder.start(self._ready)
        self._seq = 0
        self._epoch = 0
        self._seen_pids: set[int] = set()
        _watched.append(self)

    @property
    def run_id(self) -> int:
        return self.recorder.run_id

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self):
        if self.probed is not None:
            return self._batches(iter(self.probed), probed=True)
        return self._batches(iter(self.loader), probed=False)

    def close(self, status: str = "ok", error: dict | None = None):
        """End the run now (else it ends when the program exits); returns its ProfileResult."""
        if self in _watched:
            _watched.remove(self)
        return self.recorder.finish(status, error)

    @property
    def result(self):
        return self.recorder.result

    # -- per batch: the training thread's share ----------------------------------------------

    def _batches(self, iterator, probed: bool):
        """One epoch. A probed copy's batches come with where and how they were made; a loader
        that could not be probed gives waits, steps and samples (read off the batch) only."""
        clock, t0, rows, events = time.monotonic, self.t0, self.recorder.rows, self.recorder.events
        epoch, seq, seen = self._epoch, self._seq, self._seen_pids
        first = seq
        self._epoch += 1
        epoch_start = clock()
        try:
            while True:
                t_request = clock()
                try:
                    item = next(iterator)
                except StopIteration:
                    return
                t_ready = clock()
                if probed:
                    batch, (worker_id, pid, fetch_start, fetch_s, collate_s, fetch_cpu_s,
                            samples, nbytes, probe) = item
                    if pid not in seen:
                        seen.add(pid)
                        self.recorder.worker_ids[pid] = worker_id
                        if probe is not None:
                            events.append(protocol.Probe(pid, worker_id, probe))
                else:
                    batch, samples, nbytes = item, samples_in(item), None
                    worker_id, pid, fetch_start, fetch_s, collate_s, fetch_cpu_s = (
                        UNKNOWN_WORKER, 0, t_request, 0.0, 0.0, None)
                if seq == first:
                    events.append(protocol.Epoch(epoch, epoch_start - t0, t_ready - epoch_start))
                yield batch
                rows.append((seq, epoch, t_request - t0, t_ready - t_request, clock() - t_ready,
                             samples, nbytes, worker_id, pid, fetch_start - t0, fetch_s,
                             collate_s, fetch_cpu_s, None, None, None))
                seq += 1
        finally:
            self._seq = seq

    # -- once, on the recorder's thread ------------------------------------------------------

    def _ready(self) -> protocol.Ready:
        dataset = self.loader.dataset
        try:
            length = len(dataset)
        except TypeError:
            length = None
        counting = counting_rules(self.config)
        if self.unprobed_reason:
            counting = {"samples": "the leading dimension of each batch (" + self.unprobed_reason
                        + ")", "bytes": "not read"}
        return protocol.Ready(
            mode="watch",
            pid=os.getpid(),
            dataset={"target": self.name, "class": f"{type(dataset).__module__}."
                     f"{type(dataset).__qualname__}",
                     "kind": "iterable" if isinstance(dataset, IterableDataset) else "map",
                     "length": length, "probed": self.probed is not None,
                     "not_probed_because": self.unprobed_reason},
            config=self.config.to_json_dict(),
            snippet=self.config.snippet(),
            consumer={"kind": "training_loop", "step_ms": None},
            system=system.snapshot(),
            warmup_batches=self.config.warmup_batches,
            counting=counting,
            torch=torch.__version__,
        )


def _config(loader: DataLoader) -> LoaderConfig:
    try:
        return config_of(loader)
    except Exception:  # noqa: BLE001 - an odd loader: record it with what is certain
        return LoaderConfig(batch_size=getattr(loader, "batch_size", None),
                            num_workers=int(getattr(loader, "num_workers", 0) or 0))


@atexit.register
def _end_all() -> None:
    """At exit, every watched run ends: "error" with the exception if the script died of one
    (Python keeps it in sys.last_value), else "ok"."""
    failure = getattr(sys, "last_value", None)
    error = None
    if failure is not None:
        error = RunError(f"The training script ended with {type(failure).__name__}: {failure}",
                         type="watched_job_failed").to_dict()
    for watched in list(_watched):
        watched.close("error" if error else "ok", error)
