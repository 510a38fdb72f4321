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

import os
import sys
import time
from typing import Any, Iterator

import torch
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler,
                              SequentialSampler)
from torch.utils.data._utils.collate import default_collate, default_convert

from dataloader_tuner import protocol, system
from dataloader_tuner.analyse.results import ProfileResult
from dataloader_tuner.instrument import gpu, sampler
from dataloader_tuner.instrument.probes import counting_rules
from dataloader_tuner.instrument.tensors import samples_in
from dataloader_tuner.config import LoaderConfig, TunedSettings
from dataloader_tuner.store import RunStore
from dataloader_tuner.instrument.gpu_events import CopyTimes, StepGaps
from dataloader_tuner.instrument.tensors import moved
from dataloader_tuner.tune.in_place import Search
from dataloader_tuner.tune.in_place_trial import Clock
from dataloader_tuner.watcher import frameworks, shutdown
from dataloader_tuner.watcher.checks import PeriodicChecks, say as _say
from dataloader_tuner.watcher.attach import (attach, attach_blocker, detach, inner_loader,
                                             wrapper_framework)
from dataloader_tuner.watcher.job_report import RankReporter
from dataloader_tuner.watcher.rank_identity import RankIdentity, rank_identity
from dataloader_tuner.watcher.rebuild import config_of
from dataloader_tuner.record.ledger import BatchLedger, EpochMark, unprobed_meta
from dataloader_tuner.record.loop import BatchSource, TimedLoop, stop_workers
from dataloader_tuner.watcher.epoch_iterators import EpochIterators
from dataloader_tuner.watcher.in_place_tuning import InPlaceTuning, TunedEpoch
from dataloader_tuner.record.cards import Consumer, DatasetCard, dataset_length, type_name
from dataloader_tuner.run.recorder import Recorder
from dataloader_tuner.run.sinks import HistorySink

_names_taken: dict[str, int] = {}  # loaders watched under each name in this process


# The samplers DataLoader makes itself (the last for an IterableDataset; private, so looked up).
_DEFAULT_SAMPLERS = tuple(cls for cls in (
    SequentialSampler, RandomSampler,
    getattr(torch.utils.data.dataloader, "_InfiniteConstantSampler", None)) if cls is not None)


def _own_sampler(loader: DataLoader[Any]) -> bool:
    """Whether the job gave its loader a sampler or batch sampler of its own."""
    return (not isinstance(loader.sampler, _DEFAULT_SAMPLERS)
            or type(loader.batch_sampler) not in (BatchSampler, type(None)))


def training_script() -> str:
    """Who is training: for the history's list of watched jobs."""
    return os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "<interactive>"


def watch(loader: DataLoader, name: str | None = None, db: str | None = None,
          tune: bool = False, max_workers: int | None = None,
          settings_out: str | None = None, search_clock: Clock = time.monotonic
          ) -> "WatchedLoader | DataLoader[Any]":
    """Wrap ``loader`` so every batch the training loop takes is measured and saved to the run
    history (``db``, default: the dashboard's), where the dashboard shows it live. If it cannot
    be watched (say, the history cannot be written), says why and returns ``loader`` itself.

    ``tune=True`` also tries worker counts inside the job (in_place.py), up to ``max_workers``
    (default: twice the usable CPUs), switching only between batches and keeping each epoch's
    samples and order as the sampler drew them; the chosen settings are printed and saved to
    ``settings_out`` (default ``dataloader-tuner-NAME.json`` in the working folder).

    accelerate's prepared loader (``watch(accelerator.prepare(loader))``), Ray Train's
    (``watch(ray.train.torch.prepare_data_loader(loader))``) and a DataLoader
    subclass that takes its batches from DataLoader's own iterator are watched inside their own
    object, which is returned as it is (attach.py): what they add around iteration stays
    theirs. ``search_clock``: what the in-place search reads its durations on (tests give a
    clock of their own; the public ``dataloader_tuner.watch`` does not take it)."""
    try:
        inner = inner_loader(loader)
        # Watched inside its own object, which the job keeps: accelerate's prepared loader
        # (the plain DataLoader it iterates), a subclass using DataLoader's iterator.
        in_place = inner is not None or (type(loader) is not DataLoader
                                         and attach_blocker(loader) is None)
        watched = WatchedLoader(inner if inner is not None else loader, name, RunStore(db),
                                tune=tune, max_workers=max_workers, settings_out=settings_out,
                                search_clock=search_clock, in_place=in_place,
                                ahead=inner is not None, framework=wrapper_framework(loader))
        return loader if in_place else watched
    except Exception as exc:  # noqa: BLE001 - e.g. an unwritable history: train unwatched
        _say(f"{name or 'loader'}: not watched ({type(exc).__name__}: {exc}); training goes "
             "on with the loader as it is")
        return loader


class WatchedLoader:
    """Iterates like the loader it wraps (``len``, epochs, ``loader.sampler.set_epoch``, any
    attribute): the batches are the loader's own, in its order."""

    def __init__(self, loader: DataLoader, name: str | None, store: RunStore,
                 tune: bool = False, max_workers: int | None = None,
                 settings_out: str | None = None, in_place: bool = False,
                 framework: str | None = None, ahead: bool = False,
                 rank: RankIdentity | None = None, search_clock: Clock = time.monotonic
                 ) -> None:
        """``in_place``: the loader stays the job's (or its trainer's) own object, its
        iterators the watcher's (attach.py); ``framework``: the trainer that built it, named
        in the run and in the settings it recommends (frameworks.py); ``ahead``: a wrapper
        iterates it one batch ahead of the loop (accelerate's), so the wait for an epoch's
        end is the loop's wait for its last batch (``ended``); ``rank``: its place in a
        distributed job where the launcher does not say it as torchrun does (Lightning's)."""
        self.loader = loader
        self.name = name or "loader"
        self.framework = framework
        self.iterators = EpochIterators(loader, in_place)
        self.config = _config(loader)
        script = training_script()
        t0 = time.monotonic()
        self.rank = rank or rank_identity()  # None outside a distributed job
        run_id = store.create_run("watch", script, self.config.to_json_dict(),
                                  label=self.name, script=script,
                                  rank=self.rank.to_dict() if self.rank else None,
                                  framework=framework)
        # (a torchrun rank's reports say where its loader's time goes: job_report.py)
        self.history = HistorySink(store, run_id, keep_stacks=self.rank is not None)
        # Its workers sample where their time goes (instrument/sampler.py) until it ends;
        # DATALOADER_TUNER_SAMPLE=0 in the job's environment turns it off.
        sampler.ask()
        sampler.start_in_job()  # ...and this process, inside the loader's next()
        # (fast batches written in windows: NOTE [ Windows for fast loaders ])
        self.recorder = Recorder(self.history, t0, gaps=StepGaps.create(),
                                 in_job=True, keep_recent=True,
                                 windows_after=self.config.warmup_batches)
        self.loop = TimedLoop(self.recorder.ledger, self.recorder.taken.append, ahead,
                              ran_out=self._ran_out)
        self._last_ran_out: int | None = None  # the latest epoch that ran out
        self._ended: tuple[ProfileResult | None] | None = None  # (its result,) once it ended
        # Under torchrun, this rank's loader is reported to the job as a whole (rank 0 gathers).
        # Its name in the job's store: the same on every rank (the same script watches its
        # loaders in the same order), and two loaders both called "loader" kept apart.
        taken = _names_taken[self.name] = _names_taken.get(self.name, 0) + 1
        job_key = self.name if taken == 1 else f"{self.name}#{taken}"
        # The in-place search, once asked for (``tune=True`` or the dashboard's button); made
        # before the recorder's thread starts, whose checks ask for the running setting
        self.tuning = InPlaceTuning(self.name, self.recorder.events, self.rank, job_key,
                                    max_workers, search_clock,
                                    settings_out or f"dataloader-tuner-{self.name}.json",
                                    script, framework)
        # (the iterator the loop takes batches from now: who holds a late batch, stalls.py)
        self.checks = PeriodicChecks(self.name, self.recorder, t0, self._running_setting,
                                     lambda: self.iterators.current,
                                     self.rank.local_world_size if self.rank else 1)
        self.recorder.start(self._ready, on_tick=self.checks.tick)
        self.reporter = (RankReporter(self.rank, job_key, self.recorder, store,
                                      run_id, stalls=self.checks.stalls,
                                      sampled=self.history.sampled).start()
                         if self.rank else None)
        if in_place:
            attach(loader, self.__iter__)
        if self.unprobed_reason and self.config.num_workers:  # (said on the page too)
            _say(f"{self.name}: not timed inside its workers: {self.unprobed_reason}")
        if tune:
            self._start_tuning()
        self.copies = CopyTimes.create()  # None without CUDA
        shutdown.register(self)

    @property
    def run_id(self) -> int:
        return self.history.run_id

    @property
    def ledger(self) -> BatchLedger:
        return self.recorder.ledger

    @property
    def probed(self) -> DataLoader | None:
        """The probed copy of the loader its epochs run (None: it could not be probed)."""
        return self.iterators.probed

    @property
    def unprobed_reason(self) -> str | None:
        return self.iterators.unprobed_reason

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.loader, name)

    @property
    def search(self) -> Search | None:
        """The in-place search, once it started."""
        return self.tuning.search

    @property
    def tune_off_because(self) -> str | None:
        return self.tuning.off_because

    @property
    def job_key(self) -> str:
        """The loader's name in a distributed job's store (``name#2`` for a second of a name)."""
        return self.tuning.job_key

    @property
    def in_place(self) -> bool:
        return self.iterators.in_place

    @property
    def result(self) -> ProfileResult | None:
        """The run's result, once it ended."""
        return self._ended[0] if self._ended else None

    def _start_tuning(self) -> None:
        """Tune in place from the next epoch on (``tune=True``, or the dashboard asked)."""
        self.tuning.start(self.loader, self.probed)
        if self.tuning.search is not None:
            # persistent_workers keep the probed copy's workers alive between epochs: not
            # while the search runs its own.
            self.iterators.stop_kept()

    def __iter__(self):
        if self.history.tune_requested and not self.tuning.asked:
            self._start_tuning()  # the dashboard's "Tune this job", from this epoch on
        if self.tuning.running:
            mark = self.ledger.new_epoch()
            batches = self._tuned_epoch(self.tuning, mark)
            mark.given = time.monotonic()
            return batches
        self.iterators.refresh()
        # The epoch starts before iter(): starting the workers is the job's wait too.
        mark = self.ledger.new_epoch()
        iterator, probed = self.iterators.start(self.recorder.probed_workers)
        mark.given = time.monotonic()
        return self._batches(mark, iterator, probed)

    def follow(self, loader: DataLoader) -> None:
        """The job built this loader anew for the same role (a trainer's evaluation loader,
        made again at each evaluation): this run goes on over it."""
        if loader is self.loader:
            return
        if self.in_place:
            detach(self.loader)
        self.loader = loader
        self.iterators.follow(loader)
        if self.in_place:
            attach(loader, self.__iter__)

    def to(self, batch: Any, device: Any, non_blocking: bool | None = None) -> Any:
        """``batch`` with its tensors on ``device`` (tuples, lists, dicts, namedtuples kept),
        as the training loop's own ``.to(device)`` would, plus the copy's time on a CUDA
        device (GPU events, nothing synchronised). ``non_blocking`` defaults to the loader's
        ``pin_memory``: an asynchronous copy needs pinned memory."""
        if non_blocking is None:
            non_blocking = bool(self.loader.pin_memory)
        copies = self.copies
        if copies is None or not _is_cuda(device):
            return moved(batch, device, non_blocking)
        # (the batch the loop holds: the last one the ledger counted)
        result = copies.copy(self.ledger.seq - 1, batch, device, non_blocking)
        self.recorder.copies.extend(copies.resolved())
        return result

    def _ran_out(self, epoch: int) -> None:
        self._last_ran_out = epoch
        self.recorder.epoch_ended(epoch)

    def ended_whole(self) -> bool:
        """Whether every epoch the loop started ran out: a SIGTERM now ends a loop that had
        done what it asked of the loader (shutdown.py)."""
        return self.ledger.epochs > 0 and self._last_ran_out == self.ledger.epochs - 1

    def close(self, status: str = "ok", error: dict | None = None):
        """End the run now (else it ends when the program exits); returns its ProfileResult."""
        with shutdown.closing(self):
            return self._close(status, error)

    def _close(self, status: str, error: dict | None):
        if self.in_place:  # its own iterators again (an epoch under way ends unrecorded)
            detach(self.loader)
            self.iterators.stop_kept()  # the copy's workers, kept between epochs, end now
        self.tuning.close()
        if self.reporter is not None:
            # Before the run ends: rank 0's run stays "running" while it gathers the other
            # ranks' final reports, and its own report counts every batch.
            self.recorder.flush()
            self.reporter.finish(status)
        return self._end_run(status, error)

    def _end_run(self, status: str, error: dict | None) -> ProfileResult | None:
        """Write what is left, end the run and return its result (once; later calls return
        the same result)."""
        if self._ended is not None:
            return self._ended[0]
        self._ended = (None,)
        self.checks.ship_own_samples()  # the job's own, where it fetched itself
        sampler.release()
        self.recorder.stop()
        try:
            self._ended = (self.history.finish(status, time.monotonic() - self.recorder.t0,
                                               error),)
        except Exception:  # noqa: BLE001 - never the training job's problem
            self.recorder.report_failure()
        return self._ended[0]

    # -- per batch: the training thread's share ----------------------------------------------

    def _batches(self, mark: EpochMark, iterator, probed: bool):
        """One epoch. A probed copy's batches come with where and how they were made; a loader
        that could not be probed gives waits, steps and samples (read off the batch) only."""
        return self.loop.epoch(mark, _WatchedEpoch(self, iterator, probed))

    def _tuned_epoch(self, tuning: InPlaceTuning, mark: EpochMark) -> Iterator[Any]:
        """One epoch of the in-place search (in_place_tuning.py's TunedEpoch)."""
        mark.asked(time.monotonic())  # drawing the plan, starting the workers: waited for
        source = TunedEpoch(self.loader, tuning, self.ledger, mark.epoch, self._now_from,
                            self._adopt_choice)
        yield from self.loop.epoch(mark, source)

    def _now_from(self, iterator: Iterator[Any]) -> None:
        self.iterators.current = iterator

    def _adopt_choice(self) -> None:
        """The search finished: its choice saved, and running from the next epoch on."""
        chosen = self.tuning.chosen_loader(self.loader, self.config)
        self.iterators.adopt(chosen)

    # -- once, on the recorder's thread ------------------------------------------------------

    def _running_setting(self) -> TunedSettings:
        """The setting the job's batches come from now: the search's, or the loader's own."""
        if self.search is not None:
            return self.search.current
        return TunedSettings(self.loader.num_workers, self.loader.prefetch_factor)

    def _ready(self) -> protocol.Ready:
        dataset = self.loader.dataset
        counting = counting_rules(self.config)
        if self.unprobed_reason:
            counting = {"samples": "the leading dimension of each batch (" + self.unprobed_reason
                        + ")", "bytes": "not read", "workers": self.unprobed_reason}
        machine = system.snapshot(gpu.gpu_info(), wait=self.recorder.sleep_unless_stopped)
        self.checks.shm_at_start = machine.shm
        return protocol.Ready(
            mode="watch",
            pid=os.getpid(),
            # (Whether its workers could be probed is in ``counting``.)
            dataset=DatasetCard(
                target=self.name, found_as="watch(loader)",
                class_name=type_name(dataset),
                kind="iterable" if isinstance(dataset, IterableDataset) else "map",
                length=dataset_length(dataset), defines_batch_size=False, module_batch_size=None,
                has_collate_fn=self.loader.collate_fn not in (default_collate, default_convert),
                has_sampler=_own_sampler(self.loader),
                has_train_step=False, has_dataloader_kwargs=False),
            config=self.config.to_json_dict(),
            snippet=frameworks.snippet(self.framework, self.config),
            consumer=Consumer.training_loop(self.framework),
            system=machine,
            warmup_batches=self.config.warmup_batches,
            counting=counting,
            torch=torch.__version__,
            ranks_on_node=self.rank.local_world_size if self.rank else 1,
        )


class _WatchedEpoch(BatchSource):
    """A watched epoch's batches: the probed copy's, or the loader's own (its samples read off
    each batch); at the end, its workers stopped unless the loader keeps them."""

    def __init__(self, watched: WatchedLoader, iterator: Iterator[Any], probed: bool) -> None:
        super().__init__(iterator)
        self.watched = watched
        if not probed:
            self.unpack = _unprobed  # type: ignore[method-assign]

    def close(self) -> None:
        # A loop that breaks off frees its workers with the generator, as before.
        iterators, iterator = self.watched.iterators, self.iterator
        iterators.epoch_closed()
        if iterators.current is iterator:
            iterators.current = None
        if not iterators.kept(iterator):  # (its workers are gone already if it ran out)
            stop_workers(iterator, self.watched.ledger)


def _unprobed(item: Any) -> tuple[Any, Any]:
    return item, unprobed_meta(samples_in(item))


def _is_cuda(device: Any) -> bool:
    return torch.device(device).type == "cuda"


def _config(loader: DataLoader) -> LoaderConfig:
    try:
        return config_of(loader)
    except Exception:  # noqa: BLE001 - an odd loader: record it with what is certain
        return LoaderConfig(batch_size=getattr(loader, "batch_size", None),
                            num_workers=int(getattr(loader, "num_workers", 0) or 0))
