"""Tuning a watched loader in place: the search's epochs, each a ``BatchSource`` that hands the
epoch's batch plan from one setting's loader to the next, and the choice saved at the end.

The search itself (what to try, when a setting is measured, which wins) is tune/in_place.py's,
across a node's ranks tune/node.py's; this module runs it on the job's own batches.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from dataloader_tuner import protocol, system
from dataloader_tuner.config import LoaderConfig, TunedSettings
from dataloader_tuner.record.ledger import BatchLedger, samples_of
from dataloader_tuner.record.loop import BatchSource, stop_workers
from dataloader_tuner.record.trials import InPlaceDecision
from dataloader_tuner.tune.in_place import InPlaceSearch, Search
from dataloader_tuner.tune.in_place_trial import Clock
from dataloader_tuner.tune.in_place_choice import choice_result, save_choice
from dataloader_tuner.tune.node import FollowerSearch, LeaderSearch
from dataloader_tuner.watcher import frameworks
from dataloader_tuner.watcher.checks import say
from dataloader_tuner.watcher.job_report import job_store
from dataloader_tuner.watcher.rank_identity import RankIdentity
from dataloader_tuner.watcher.rebuild import copy_kwargs, with_probes

MAX_PLANNED_BATCHES = 2_000_000  # an epoch's index lists held in memory while tuning


class InPlaceTuning:
    """One watched loader's in-place search, from the epoch it starts (``start``) to the choice
    saved. ``search`` is None until then, and where the loader cannot be tuned in place
    (``off_because`` says why)."""

    def __init__(self, name: str, events: list, rank: RankIdentity | None, job_key: str,
                 max_workers: int | None, clock: Clock, settings_out: str, target: str,
                 framework: str | None) -> None:
        """``job_key``: the loader's name in a distributed job's store; ``target``: the
        training script, named in the settings file; ``framework``: the trainer whose
        snippet the choice is written as."""
        self.name, self.events, self.rank, self.job_key = name, events, rank, job_key
        self.max_workers, self.clock, self.settings_out = max_workers, clock, settings_out
        self.target, self.framework = target, framework
        self.off_because: str | None = None
        self.search: Search | None = None
        self.logged = 0  # decisions of the search already written to the run
        self.saved = False  # its choice handed over (saved, and running from the next epoch)

    @property
    def asked(self) -> bool:
        """Tuning was asked for (it runs, ran, or was turned off)."""
        return self.search is not None or self.off_because is not None

    def start(self, loader: DataLoader, probed: DataLoader | None) -> None:
        """The search starts with the next epoch, or says why it cannot."""
        name, rank, job_key = self.name, self.rank, self.job_key
        self.off_because = in_place_blocker(loader, probed)
        if self.off_because:
            say(f"{name}: tuning in place is off: {self.off_because}")
            self.events.append(protocol.Measured(InPlaceDecision(
                loader.num_workers, None, None, f"tuning in place is off: {self.off_because}")))
            return
        workers = loader.num_workers
        prefetch = loader.prefetch_factor if workers and loader.prefetch_factor != 2 else None
        # The node's CPUs are shared by its ranks' loaders (each rank searches on its own).
        sharing = rank.local_world_size if rank else 1
        start = TunedSettings(workers, prefetch)
        cpus = system.usable_cpus() / max(sharing, 1)
        alone = InPlaceSearch(start, self.max_workers
                              or max(2, 2 * system.usable_cpus() // max(sharing, 1)),
                              # each epoch restarts the workers unless the job keeps them
                              # (the batch sampler has a length: in_place_blocker took it)
                              None if loader.persistent_workers
                              else len(loader.batch_sampler),  # type: ignore[arg-type]
                              clock=self.clock, cpus=cpus)
        self.search = alone
        if rank is not None and rank.local_world_size > 1:
            # The node's ranks switch together, local rank 0 leading (tune/node.py).
            node, local = rank.node_rank, rank.local_rank
            node_search = (LeaderSearch(alone, job_key, node, rank.local_world_size,
                                        job_store) if local == 0 else
                           FollowerSearch(start, job_key, node, local, job_store))
            node_search.start()
            self.search = node_search

    @property
    def running(self) -> bool:
        """The search runs this epoch (it started and has not finished)."""
        return self.search is not None and not self.search.finished

    def log_decisions(self) -> bool:
        """New lines of the search's log into the run (shown live) and on stderr; True once,
        when the search has finished and its choice is to be saved."""
        search = self.search
        assert search is not None
        for decision in search.decisions[self.logged:]:
            self.events.append(protocol.Measured(decision))
            rate = (f"{decision.samples_per_s:.1f} samples/s" if decision.samples_per_s
                    else "no rate")
            ci = f" ±{decision.rate_ci:.0%}" if decision.rate_ci is not None else ""
            say(f"{self.name}: num_workers={decision.num_workers}: {rate}{ci}: "
                f"{decision.verdict}")
        self.logged = len(search.decisions)
        if search.finished and not self.saved:
            self.saved = True
            return True
        return False

    def chosen_loader(self, loader: DataLoader, config: LoaderConfig) -> DataLoader:
        """The choice saved (the node's leader saves it, once) and, from the next epoch on,
        a copy of the job's loader with it (its own persistent_workers kept), drawing from its
        sampler and generator as before."""
        search = self.search
        assert search is not None
        result = choice_result(search, config, self.target,
                               lambda chosen: frameworks.snippet(self.framework, chosen))
        if not isinstance(search, FollowerSearch):
            where = save_choice(result, self.settings_out)
            say(f"{self.name}: tuned in place: {result.snippet} ({where}; "
                "dataloader_tuner.load_settings reads it)")
        chosen = result.recommended or {}
        # The count was measured to pay in this very job: torch's generic warning about counts
        # above its suggestion would otherwise repeat at every epoch.
        warnings.filterwarnings("ignore", message=".*suggested max number of worker")
        return DataLoader(loader.dataset, batch_sampler=loader.batch_sampler,
                          **copy_kwargs(loader, chosen["num_workers"], chosen["prefetch_factor"],
                                        bool(chosen["persistent_workers"]), loader.generator))

    def close(self) -> None:
        """The loader's run ends: a search that did not finish says so."""
        search = self.search
        if search is None:
            return
        if not search.finished:
            say(f"{self.name}: tuning in place did not finish before the loader's run ended "
                f"({len(search.measured)} setting(s) measured to the end); the job kept "
                f"num_workers={search.current.num_workers}. A longer job, or more epochs, "
                "lets it finish.")
        search.close()


class TunedEpoch(BatchSource):
    """One epoch while tuning in place. The epoch's batches are drawn from the loader's own
    batch sampler once, as DataLoader would (its sampler first, then the workers' base seed,
    from the loader's generator: later epochs draw exactly as without the tool); each
    setting's loader is handed the batches not yet taken, so a switch between two batches
    repeats and skips nothing and keeps the order."""

    def __init__(self, loader: DataLoader, tuning: InPlaceTuning, ledger: BatchLedger,
                 epoch: int, on_open: Callable[[Iterator[Any]], None],
                 on_finished: Callable[[], None]) -> None:
        assert loader.batch_sampler is not None  # in_place_blocker turns such loaders away
        assert tuning.search is not None
        self.loader, self.tuning, self.search, self.ledger = loader, tuning, tuning.search, ledger
        self.on_open, self.on_finished = on_open, on_finished
        # As DataLoader's iterator: the sampler's iterator made, the workers' base seed drawn,
        # then the first indices (a RandomSampler draws its own seed only then).
        sampler_iter = iter(loader.batch_sampler)
        self.base_seed = int(torch.empty((), dtype=torch.int64).random_(
            generator=loader.generator).item())
        self.plan = list(sampler_iter)
        self.taken_count = self.segment = 0
        self.opened: float | None = None  # a switched loader's start: its start-up, for the search
        self.search.epoch_started(epoch)
        super().__init__(self._open(self.search.current))

    def unpack(self, item: Any) -> Any:
        self.since = None
        self.ledger.opening = False  # a switched loader's first batch came
        return item

    def recover(self, error: Exception) -> bool:
        """A tried setting failed: each fails once at most (then it is dropped; a failing best
        gives way to the job's own), so a bad sample ends at the job's own error."""
        search = self.search
        if search.current == search.baseline:
            return False  # the job's own settings: its own error, as without the tool
        fallback = search.setting_failed(search.current, f"{type(error).__name__}: {error}")
        self._log()
        self._switch(fallback, self.since or time.monotonic())
        return True

    def taken(self, seq: int, meta: Any, t_request: float, t_ready: float,
              t_back: float) -> None:
        self.taken_count += 1
        # (not the old loader's shutdown: the job with one setting never pays that)
        asked = self.opened or t_request
        switch = self.search.after_batch(samples_of(meta), t_back - asked, t_ready - asked)
        self.opened = None
        # (A node's leader finishes when the node switches to its choice, after the decision
        # was logged: tune/node.py.)
        if (len(self.search.decisions) > self.tuning.logged
                or (self.search.finished and not self.tuning.saved)):
            self._log()
        if switch is not None and self.taken_count < len(self.plan):
            # stopping one loader, starting the next: the loop waits from here
            self._switch(switch, time.monotonic())

    def close(self) -> None:
        stop_workers(self.iterator, self.ledger)

    def _log(self) -> None:
        if self.tuning.log_decisions():
            self.on_finished()

    def _switch(self, setting: TunedSettings, since: float) -> None:
        self.since = since
        stop_workers(self.iterator)
        self.opened = time.monotonic()
        self.ledger.opening = True  # its first batch carries the new workers' start-up
        self.segment += 1
        self.iterator = self._open(setting)

    def _open(self, setting: TunedSettings) -> Iterator[Any]:
        """``_segment``, and if a tried setting cannot even start, the best one so far (or the
        job's own) instead: tuning must never be what stops training."""
        while True:
            try:
                iterator = self._segment(setting)
            except Exception as exc:  # noqa: BLE001
                if setting == self.search.baseline:
                    raise  # the job's own settings: its own error, as without the tool
                setting = self.search.setting_failed(setting, f"{type(exc).__name__}: {exc}")
                self._log()
                continue
            self.on_open(iterator)
            return iterator

    def _segment(self, setting: TunedSettings) -> Iterator[Any]:
        """An iterator over the plan's batches not yet taken with ``setting``, probed like the
        watched copy."""
        loader, start = self.loader, self.taken_count
        # Workers seeded from this epoch's base seed, not from the loader's generator: that one
        # is left to the sampler, so later epochs shuffle as without the tool.
        kwargs = copy_kwargs(loader, setting.num_workers, setting.prefetch_factor, False,
                             torch.Generator().manual_seed(self.base_seed
                                                           + 1_000_003 * self.segment))
        kwargs["batch_sampler"] = self.plan[start:]
        self.search.loader_started()
        with warnings.catch_warnings():  # torch's "suggested max number of worker": the
            # search tries such counts on purpose and judges them by the loop's own rate
            warnings.filterwarnings("ignore", message=".*suggested max number of worker")
            return iter(with_probes(loader, kwargs))


def not_rebuilt_reason(loader: DataLoader) -> str:
    """Why a loader the watcher could not rebuild with probes cannot be switched either: what a
    switch would break in its class."""
    name = type(loader).__name__
    if type(loader) is DataLoader:
        return "the loader could not be rebuilt with probes"
    if _torchdata_stateful(loader):
        return (f"{name}'s state_dict() records num_workers, and its load_state_dict() takes "
                "only a state of the same count (torchdata asserts it): a checkpoint taken "
                "after a switch of workers would not load in your script as written, nor one "
                "taken before it in the switched loader; tune it offline (dataloader-tuner "
                "tune) and set the count in your script")
    if callable(getattr(loader, "state_dict", None)):
        return (f"{name} keeps its iterator's place for state_dict() and load_state_dict() (a "
                "checkpoint resumes from it): a switch of workers would hand the loop batches "
                f"from an iterator {name} does not know, so a checkpoint taken after it would "
                "resume at the wrong batch; tune it offline (dataloader-tuner tune) instead")
    return (f"{name} is a DataLoader subclass that makes its own iterators: a switch of workers "
            f"would leave out what {name} does around them")


def _torchdata_stateful(loader: DataLoader) -> bool:
    """Whether ``loader`` is torchdata's StatefulDataLoader (torchdata imported by the job)."""
    module = sys.modules.get("torchdata.stateful_dataloader.stateful_dataloader")
    return module is not None and isinstance(loader, module.StatefulDataLoader)


def in_place_blocker(loader: DataLoader, probed: DataLoader | None) -> str | None:
    """Why this loader cannot be tuned in place, or None."""
    if probed is None:
        return not_rebuilt_reason(loader)
    if isinstance(loader.dataset, IterableDataset):
        return ("an IterableDataset decides its own order and how it splits across workers: a "
                "switch could repeat or skip samples")
    if loader.batch_sampler is None:
        return ("without batching by DataLoader (batch_size=None) there is no batch plan to "
                "hand over")
    if not getattr(loader, "in_order", True):
        return "with in_order=False batches arrive out of order: a switch could repeat or skip"
    try:
        batches = len(loader.batch_sampler)  # type: ignore[arg-type]  # TypeError: no length
    except TypeError:
        return "its batch sampler has no length (an endless sampler): an epoch cannot be planned"
    if batches > MAX_PLANNED_BATCHES:
        return (f"an epoch of {batches:,} batches is too long to hold as a plan (over "
                f"{MAX_PLANNED_BATCHES:,})")
    return None

