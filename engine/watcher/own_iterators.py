"""A DataLoader subclass that makes its own iterators, watched inside its workers: the probes
set on its instance while it makes each iterator, then put back (NOTE [ Probing a loader that
makes its own iterators ], instrument/own_iterator_probes.py)."""

from __future__ import annotations

import inspect
from typing import Any, Generator, Iterator

from torch.utils.data import DataLoader

from dataloader_tuner.instrument.own_iterator_probes import TimedFetchInit, can_time_fetch
from dataloader_tuner.instrument.probes import timed_collate

LOOP_SIDE = "the watcher times your loop's side (waits, steps, samples)"
# Classes whose __iter__ and _get_iterator hand their iterator's batches on untouched (for
# datasets of the class named, where they do only for those): a subclass's own __iter__ may
# read or change each batch, which would then be the probes' pair.
UNTOUCHED_BATCHES: dict[str, str | None] = {
    "torch.utils.data.dataloader.DataLoader": None,
    "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader": None,
    # litdata unpacks its Combined and Parallel datasets' batches; a StreamingDataset's it
    # yields as they come (counting them for its state_dict)
    "litdata.streaming.dataloader.StreamingDataLoader": "litdata.streaming.dataset.StreamingDataset",
}


class ProbedOnInstance:
    """Makes the loader's iterators with the probes in place; its batches come as a probed
    copy's do, ``(batch, BatchMeta)``."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.own: tuple[Any, Any] | None = None  # the loader's collate_fn, worker_init_fn

    def iterator(self) -> tuple[Iterator[Any], bool]:
        """``iter(loader)``, as the subclass makes it, with the probes for its workers, and
        whether it was made with them: a StatefulDataLoader asked for its ``state_dict()``
        before its first epoch (accelerate's shard does, when made) made that epoch's iterator
        then, and it runs unprobed. A subclass whose ``__iter__`` is a generator (litdata's)
        makes its iterator at the first ``next()``: the probes stay set until then."""
        loader = self.loader
        self.put_back()  # (an earlier epoch's, never started)
        self.own = (loader.collate_fn, loader.worker_init_fn)
        collate = loader.collate_fn = timed_collate(self.own[0], auto_collation=True)
        loader.worker_init_fn = TimedFetchInit(self.own[1])
        try:
            made = iter(loader)
        except BaseException:
            self.put_back()
            raise
        if inspect.isgenerator(made):
            return self._put_back_once_made(made), True
        self.put_back()  # the iterator keeps them; the loader reads as the user set it
        return made, getattr(made, "_collate_fn", collate) is collate

    def _put_back_once_made(self, batches: Generator[Any, None, None]
                            ) -> Generator[Any, None, None]:
        try:
            first = next(batches)
        except StopIteration:
            return
        finally:
            self.put_back()
        yield first
        yield from batches

    def put_back(self) -> None:
        """The loader's own collate_fn and worker_init_fn again."""
        if self.own is not None:
            self.loader.collate_fn, self.loader.worker_init_fn = self.own
            self.own = None


def probe_on_instance(loader: DataLoader) -> tuple[ProbedOnInstance | None, str | None]:
    """(the probes, None), or (None, which part cannot be measured and why)."""
    name = type(loader).__name__
    changer = next((method for method in ("__iter__", "_get_iterator")
                    if not _untouched(_defined_by(type(loader), method), loader.dataset)), None)
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


def _untouched(owner: str, dataset: Any) -> bool:
    """Whether ``owner``'s method hands on the batches of ``dataset`` untouched."""
    if owner not in UNTOUCHED_BATCHES:
        return False
    needs = UNTOUCHED_BATCHES[owner]
    return needs is None or any(_path(cls) == needs for cls in type(dataset).__mro__)


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _defined_by(cls: type, method: str) -> str:
    """The class in ``cls``'s MRO that defines ``method``, as module.name."""
    return _path(next(klass for klass in cls.__mro__ if method in vars(klass)))
