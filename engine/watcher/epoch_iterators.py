"""The iterators a watched loader's epochs run: its probed copy's (rebuild.py: each batch comes
with where and how it was made), a subclass's own made with the probes set on its instance
(own_iterators.py), or, where the loader could not be probed, its own."""

from __future__ import annotations

import sys
from typing import Any, Iterator

from torch.utils.data import DataLoader

from dataloader_tuner.instrument import first_fetch, threads
from dataloader_tuner.record.loop import stop_workers
from dataloader_tuner.watcher.attach import attach_blocker
from dataloader_tuner.watcher.own_iterators import ProbedOnInstance, probe_on_instance
from dataloader_tuner.watcher.rebuild import instrumented


class EpochIterators:
    def __init__(self, loader: DataLoader, in_place: bool) -> None:
        """``in_place``: the loader stays the job's (or its trainer's) own object, its
        iterators the watcher's (attach.py)."""
        self.loader, self.in_place = loader, in_place
        self.probed: DataLoader | None = None
        self.on_instance: ProbedOnInstance | None = None
        self.unprobed_reason: str | None = None
        self._probe(loader)
        self.init_fn_copied = loader.worker_init_fn  # the one the probed copy runs
        self.own: Any = None  # in place and not probed: the loader's own persistent iterator
        # The probed copy whose workers are being probed, where its probes start in the
        # recorder's list, and what its workers were last forked with (probe_once)
        self.probes_of: Any = None
        self.probes_from = 0
        self.probes_inherited: tuple = ()
        self.current: Any = None  # the iterator the loop takes batches from now

    def refresh(self) -> None:
        """The probed copy made again where the loader's ``worker_init_fn`` changed: a trainer
        may set it after handing the loader over (Lightning, for seed_everything(workers=True))."""
        if self.in_place and self.loader.worker_init_fn is not self.init_fn_copied:
            self.copy_again()

    def start(self, probed_workers: list[int]) -> tuple[Iterator[Any], bool]:
        """The next epoch's iterator, and whether its batches are probed; ``probed_workers``:
        the worker ids whose probes the recorder has read."""
        copy = self.probed
        if copy is None:
            probed = False
            if self.on_instance is not None:
                self.current, probed = self.on_instance.iterator()
            else:
                self.current = self._own_iterator()
            return self.current, probed
        self._probe_once(copy, probed_workers)
        self.current = iter(copy)
        self.probes_inherited = _inherited(copy)  # what this epoch's workers were forked with
        return self.current, True

    def copy_again(self) -> None:
        """The probed copy made again from the loader as it is now."""
        self.stop_kept()  # workers it kept between epochs end with it
        self._probe(self.loader)
        self.init_fn_copied = self.loader.worker_init_fn

    def follow(self, loader: DataLoader) -> None:
        """Epochs from now on run ``loader`` (built anew by the job for the same role)."""
        self.loader, self.own = loader, None
        self.copy_again()

    def adopt(self, chosen: DataLoader) -> None:
        """Epochs from now on run ``chosen`` (a tuned copy of the loader), probed."""
        self.probed = instrumented(chosen)[0] or self.probed

    def _probe(self, loader: DataLoader) -> None:
        """A probed copy of ``loader``, or probes for a subclass's own iterators (one not
        watched in place, or held by accelerate's stateful shard: attach.py), or why not."""
        self.probed, self.on_instance = None, None
        if self._own_iterators(loader):
            self.on_instance, self.unprobed_reason = probe_on_instance(loader)
        else:
            self.probed, self.unprobed_reason = instrumented(loader, any_class=self.in_place)

    def _own_iterators(self, loader: DataLoader) -> bool:
        """Whether ``loader`` is a subclass whose own iterators its epochs run."""
        return (isinstance(loader, DataLoader) and type(loader) is not DataLoader
                and (not self.in_place or attach_blocker(loader) is not None))

    def stop_kept(self) -> None:
        """The probed copy's workers, kept between epochs (persistent_workers), end now."""
        if self.probed is not None:
            stop_workers(getattr(self.probed, "_iterator", None))
            self.probed._iterator = None

    def epoch_closed(self) -> None:
        """An epoch ended or was broken off: a subclass's own attributes are its own again,
        where its iterator was never started (own_iterators.py)."""
        if self.on_instance is not None:
            self.on_instance.put_back()

    def kept(self, iterator: Any) -> bool:
        """Whether ``iterator`` is one a loader keeps for its next epoch (persistent workers):
        the probed copy's, or the job's own loader's where it could not be probed."""
        return iterator is self.own or any(
            held is not None and getattr(held, "_iterator", None) is iterator
            for held in (self.probed, self.loader))

    def _probe_once(self, copy: DataLoader, probed_workers: list[int]) -> None:
        """A copy's workers have their thread pools and random generators read (the probe) in
        the epochs until each worker id has been read once: the next epochs' workers, forked
        from this process to run the same code, have the same, and reading them made each
        epoch's first batch ~2 ms later. Read afresh for a new copy (another loader, another
        setting), and where what a fork passes on changed since the last epoch's workers were
        forked (_inherited)."""
        wrapper: Any = copy.dataset  # instrumented's wrap_dataset
        if self.probes_of is not copy or _inherited(copy) != self.probes_inherited:
            self.probes_of, self.probes_from = copy, len(probed_workers)
            wrapper.probe_first = True
            return
        read = set(probed_workers[self.probes_from:])
        if read >= set(range(copy.num_workers)):
            wrapper.probe_first = False

    def _own_iterator(self) -> Iterator[Any]:
        """The loader's own iterator (not probed): watched in place, made as DataLoader.__iter__
        would, under the watcher's hold on it (attach.py)."""
        loader = self.loader
        if not self.in_place:
            return iter(loader)
        if self._own_iterators(loader):  # (its __iter__ is the watcher's on the instance)
            return type(loader).__iter__(loader)
        if not (loader.persistent_workers and loader.num_workers > 0):
            return DataLoader._get_iterator(loader)
        if self.own is None:
            self.own = DataLoader._get_iterator(loader)
        else:
            self.own._reset(loader)
        return self.own


def _inherited(copy: DataLoader) -> tuple:
    """What workers forked now would inherit that their probe reads (~70 us to read here):
    the modules loaded (a new extension module can bring a thread pool), the thread variables
    and the dataset's random generators (which it holds, not their states)."""
    dataset = getattr(copy.dataset, "inner", copy.dataset)
    return (len(sys.modules), tuple(sorted(threads.pool_env().items())),
            tuple(sorted(first_fetch.rng_state(dataset))))

