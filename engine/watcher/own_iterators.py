"""A DataLoader subclass that makes its own iterators, watched inside its workers: the probes
set on its instance while it makes each iterator, then put back (NOTE [ Probing a loader that
makes its own iterators ], instrument/own_iterators.py)."""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader

from dataloader_tuner.instrument.own_iterators import TimedFetchInit, can_time_fetch
from dataloader_tuner.instrument.probes import timed_collate

LOOP_SIDE = "the watcher times your loop's side (waits, steps, samples)"
# Classes whose __iter__ and _get_iterator hand their iterator's batches on untouched: a
# subclass's own __iter__ may read or change each batch, which would then be the probes' pair.
UNTOUCHED_BATCHES = ("torch.utils.data.dataloader.DataLoader",
                     "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader")


class ProbedOnInstance:
    """Makes the loader's iterators with the probes in place; its batches come as a probed
    copy's do, ``(batch, BatchMeta)``."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def iterator(self) -> Iterator[Any]:
        """``iter(loader)``, as the subclass makes it, with the probes for its workers."""
        loader = self.loader
        collate_fn, init_fn = loader.collate_fn, loader.worker_init_fn
        loader.collate_fn = timed_collate(collate_fn, auto_collation=True)
        loader.worker_init_fn = TimedFetchInit(init_fn)
        try:
            return iter(loader)
        finally:  # the iterator keeps them; the loader reads as the user set it
            loader.collate_fn, loader.worker_init_fn = collate_fn, init_fn


def probe_on_instance(loader: DataLoader) -> tuple[ProbedOnInstance | None, str | None]:
    """(the probes, None), or (None, which part cannot be measured and why)."""
    name = type(loader).__name__
    changer = next((method for method in ("__iter__", "_get_iterator")
                    if _defined_by(type(loader), method) not in UNTOUCHED_BATCHES), None)
    if changer is not None:
        return None, (f"{name} makes its own iterators with its own {changer}, which may read "
                      f"or change each batch: its workers are not probed; {LOOP_SIDE}")
    if not loader.num_workers:
        return None, (f"{name} makes its own iterators, and at 0 workers its batches in your "
                      f"loop's process: their fetch and collate are inside the loop's wait; "
                      f"{LOOP_SIDE}")
    if loader.batch_sampler is None:
        return None, (f"{name} makes its own iterators and batch_size=None: its workers' "
                      f"fetches are not timed; {LOOP_SIDE}")
    if not can_time_fetch(loader.dataset):
        return None, (f"{name} makes its own iterators, and its dataset (a "
                      f"{type(loader.dataset).__name__}) cannot be timed inside its workers "
                      f"without wrapping it; {LOOP_SIDE}")
    if loader.persistent_workers and getattr(loader, "_iterator", None) is not None:
        return None, (f"{name} keeps workers started before watch() (persistent_workers): "
                      f"they run without probes; {LOOP_SIDE}")
    return ProbedOnInstance(loader), None


def _defined_by(cls: type, method: str) -> str:
    """The class in ``cls``'s MRO that defines ``method``, as module.name."""
    owner = next(klass for klass in cls.__mro__ if method in vars(klass))
    return f"{owner.__module__}.{owner.__qualname__}"
