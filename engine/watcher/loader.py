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

import json
import os
import sys
import time
import warnings
from dataclasses import asdict
from typing import Any, Iterator

import torch
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler,
                              SequentialSampler)
from torch.utils.data._utils.collate import default_collate, default_convert

from dataloader_tuner import protocol, system
from dataloader_tuner.access import open_private
from dataloader_tuner.analyse.results import ProfileResult, TuneResult
from dataloader_tuner.instrument import gpu, probes, threads
from dataloader_tuner.instrument.probes import (OfferingStack, RecordingBatchSampler,
                                               TimedCollate, counting_rules, samples_in,
                                               wrap_dataset)
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.store import RunStore
from dataloader_tuner.settings import settings_file
from dataloader_tuner.instrument.gpu_events import CopyTimes, StepGaps
from dataloader_tuner.instrument.tensors import moved
from dataloader_tuner.tune.in_place import Clock, InPlaceSearch, Search, Setting
from dataloader_tuner.watcher import frameworks, shutdown
from dataloader_tuner.watcher.checks import PeriodicChecks, say as _say
from dataloader_tuner.watcher.attach import attach, attach_blocker, detach, inner_loader
from dataloader_tuner.watcher.job_report import RankReporter, job_store
from dataloader_tuner.tune.node import FollowerSearch, LeaderSearch
from dataloader_tuner.watcher.rank_identity import RankIdentity, rank_identity
from dataloader_tuner.watcher.rebuild import config_of, copy_kwargs, instrumented
from dataloader_tuner.record.ledger import EpochMark, samples_of, unprobed_meta
from dataloader_tuner.child.dataset_card import dataset_length
from dataloader_tuner.child.target import type_name
from dataloader_tuner.record.cards import DatasetCard
from dataloader_tuner.run.recorder import Recorder
from dataloader_tuner.record.trials import InPlaceTrial
from dataloader_tuner.run.sinks import HistorySink

MAX_PLANNED_BATCHES = 2_000_000  # an epoch's index lists held in memory while tuning
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

    accelerate's prepared loader (``watch(accelerator.prepare(loader))``) and a DataLoader
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
                                ahead=inner is not None,
                                framework=frameworks.ACCELERATE if inner is not None else None)
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
        self.in_place, self.framework, self.ahead = in_place, framework, ahead
        self.probed, self.unprobed_reason = instrumented(loader, any_class=in_place)
        self._init_fn_copied = loader.worker_init_fn  # the one the probed copy runs
        self._own: Any = None  # in place and not probed: the loader's own persistent iterator
        # The probed copy whose workers are being probed, and where its probes start in the
        # recorder's (_probe_once)
        self._probes_of: Any = None
        self._probes_from = 0
        self._probes_inherited: tuple = ()
        self.search: Search | None = None
        self.tune_off_because: str | None = None
        self.max_workers = max_workers
        self.search_clock = search_clock  # the in-place search's (watch's docstring)
        self.settings_out = settings_out or f"dataloader-tuner-{self.name}.json"
        self._logged = 0  # decisions of the search already written to the run
        self._saved = False  # the search's choice saved (and running from the next epoch)
        self.config = _config(loader)
        self.script = training_script()
        self.t0 = time.monotonic()
        self.rank = rank or rank_identity()  # None outside a distributed job
        run_id = store.create_run("watch", self.script, self.config.to_json_dict(),
                                  label=self.name, script=self.script,
                                  rank=self.rank.to_dict() if self.rank else None,
                                  framework=framework)
        self.history = HistorySink(store, run_id)
        self.recorder = Recorder(self.history, self.t0, gaps=StepGaps.create(),
                                 own_workers_only=True, keep_recent=True)
        self.ledger = self.recorder.ledger
        self.result: ProfileResult | None = None  # once the run has ended
        self._ended = False
        # The iterator the loop takes batches from now: who holds a late batch (stalls.py)
        self._iterator: Any = None
        self.checks = PeriodicChecks(self.name, self.recorder, self.t0, self._running_setting,
                                     lambda: self._iterator,
                                     self.rank.local_world_size if self.rank else 1)
        self.recorder.start(self._ready, on_tick=self.checks.tick)
        # Under torchrun, this rank's loader is reported to the job as a whole (rank 0 gathers).
        # Its name in the job's store: the same on every rank (the same script watches its
        # loaders in the same order), and two loaders both called "loader" kept apart.
        taken = _names_taken[self.name] = _names_taken.get(self.name, 0) + 1
        self.job_key = self.name if taken == 1 else f"{self.name}#{taken}"
        self.reporter = (RankReporter(self.rank, self.job_key, self.recorder, store,
                                      run_id, stalls=self.checks.stalls).start()
                         if self.rank else None)
        if in_place:
            attach(loader, self.__iter__)
        if tune:
            self._start_tuning()
        self.copies = CopyTimes.create()  # None without CUDA
        self._handed = 0
        shutdown.register(self)

    @property
    def run_id(self) -> int:
        return self.history.run_id

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.loader, name)

    def _start_tuning(self) -> None:
        """Tune in place from the next epoch on (``tune=True``, or the dashboard asked)."""
        loader = self.loader
        self.tune_off_because = in_place_blocker(loader, self.probed)
        if self.tune_off_because:
            _say(f"{self.name}: tuning in place is off: {self.tune_off_because}")
            self.recorder.events.append(protocol.Trial(InPlaceTrial(
                loader.num_workers, None, None,
                f"tuning in place is off: {self.tune_off_because}")))
            return
        workers = loader.num_workers
        prefetch = loader.prefetch_factor if workers and loader.prefetch_factor != 2 else None
        # The node's CPUs are shared by its ranks' loaders (each rank searches on its own).
        sharing = self.rank.local_world_size if self.rank else 1
        start = Setting(workers, prefetch)
        alone = InPlaceSearch(start, self.max_workers
                              or max(2, 2 * system.usable_cpus() // max(sharing, 1)),
                              # each epoch restarts the workers unless the job keeps them
                              # (the batch sampler has a length: in_place_blocker took it)
                              None if loader.persistent_workers
                              else len(loader.batch_sampler),  # type: ignore[arg-type]
                              clock=self.search_clock)
        search: Search = alone
        if self.rank is not None and self.rank.local_world_size > 1:
            # The node's ranks switch together, local rank 0 leading (tune/node.py).
            node, local = self.rank.node_rank, self.rank.local_rank
            node_search = (LeaderSearch(alone, self.job_key, node, self.rank.local_world_size,
                                        job_store) if local == 0 else
                           FollowerSearch(start, self.job_key, node, local, job_store))
            node_search.start()
            search = node_search
        self.search = search
        # persistent_workers keep the probed copy's workers alive between epochs: not while
        # the search runs its own.
        _shutdown(getattr(self.probed, "_iterator", None))
        if self.probed is not None:
            self.probed._iterator = None

    def __iter__(self):
        if (self.history.tune_requested and self.search is None
                and self.tune_off_because is None):
            self._start_tuning()  # the dashboard's "Tune this job", from this epoch on
        if self.search is not None and not self.search.finished:
            mark = self.ledger.new_epoch()
            batches = self._tuned_batches(self.search, mark)
            mark.given = time.monotonic()
            return batches
        if self.in_place and self.loader.worker_init_fn is not self._init_fn_copied:
            self._copy_again()
        # The epoch starts before iter(): starting the workers is the job's wait too.
        mark = self.ledger.new_epoch()
        probed = self.probed is not None
        if probed:
            self._probe_once(self.probed)
        self._iterator = iter(self.probed) if probed else self._own_iterator()
        if probed:  # what this epoch's workers were forked with
            self._probes_inherited = _inherited(self.probed)
        mark.given = time.monotonic()
        return self._batches(mark, self._iterator, probed=probed)

    def _copy_again(self) -> None:
        """The probed copy made again from the loader as it is now: a trainer may set its
        ``worker_init_fn`` after handing it over (Lightning, for seed_everything(workers=True))."""
        if self.probed is not None:  # workers it kept between epochs end with it
            _shutdown(getattr(self.probed, "_iterator", None))
        self.probed, self.unprobed_reason = instrumented(self.loader, any_class=self.in_place)
        self._init_fn_copied = self.loader.worker_init_fn

    def _probe_once(self, copy: DataLoader) -> None:
        """A copy's workers have their thread pools and random generators read (the probe) in
        the epochs until each worker id has been read once: the next epochs' workers, forked
        from this process to run the same code, have the same, and reading them made each
        epoch's first batch ~2 ms later. Read afresh for a new copy (another loader, another
        setting), and where what a fork passes on changed since the last epoch's workers were
        forked (_inherited)."""
        wrapper: Any = copy.dataset  # instrumented's wrap_dataset
        if self._probes_of is not copy or _inherited(copy) != self._probes_inherited:
            self._probes_of, self._probes_from = copy, len(self.recorder.probed_workers)
            wrapper.probe_first = True
            return
        read = set(self.recorder.probed_workers[self._probes_from:])
        if read >= set(range(copy.num_workers)):
            wrapper.probe_first = False

    def follow(self, loader: DataLoader) -> None:
        """The job built this loader anew for the same role (a trainer's evaluation loader,
        made again at each evaluation): this run goes on over it."""
        if loader is self.loader:
            return
        if self.in_place:
            detach(self.loader)
        self.loader, self._own = loader, None
        self._copy_again()
        if self.in_place:
            attach(loader, self.__iter__)

    def _own_iterator(self) -> Iterator[Any]:
        """The loader's own iterator (not probed): watched in place, made as DataLoader.__iter__
        would, under the watcher's hold on it (attach.py)."""
        loader = self.loader
        if not self.in_place:
            return iter(loader)
        if not (loader.persistent_workers and loader.num_workers > 0):
            return DataLoader._get_iterator(loader)
        if self._own is None:
            self._own = DataLoader._get_iterator(loader)
        else:
            self._own._reset(loader)
        return self._own

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
        result = copies.copy(self._handed, batch, device, non_blocking)
        self.recorder.copies.extend(copies.resolved())
        return result

    def close(self, status: str = "ok", error: dict | None = None):
        """End the run now (else it ends when the program exits); returns its ProfileResult."""
        with shutdown.closing(self):
            return self._close(status, error)

    def _close(self, status: str, error: dict | None):
        if self.in_place:  # its own iterators again (an epoch under way ends unrecorded)
            detach(self.loader)
            if self.probed is not None:  # the copy's workers, kept between epochs, end now
                _shutdown(getattr(self.probed, "_iterator", None))
                self.probed._iterator = None
        if self.search is not None and not self.search.finished:
            measured = len(self.search.measured)
            _say(f"{self.name}: tuning in place did not finish before the loader's run ended "
                 f"({measured} setting(s) measured to the end); the job kept "
                 f"num_workers={self.search.current.num_workers}. A longer job, or more epochs, "
                 "lets it finish.")
        if self.search is not None:
            self.search.close()
        if self.reporter is not None:
            # Before the run ends: rank 0's run stays "running" while it gathers the other
            # ranks' final reports, and its own report counts every batch.
            self.recorder.flush()
            self.reporter.finish(status)
        return self._end_run(status, error)

    def _end_run(self, status: str, error: dict | None) -> ProfileResult | None:
        """Write what is left, end the run and return its result (once; later calls return
        the same result)."""
        if self._ended:
            return self.result
        self._ended = True
        self.recorder.stop()
        try:
            self.result = self.history.finish(status, time.monotonic() - self.t0, error)
        except Exception:  # noqa: BLE001 - never the training job's problem
            self.recorder.report_failure()
        return self.result

    # -- per batch: the training thread's share ----------------------------------------------

    def _batches(self, mark: EpochMark, iterator, probed: bool):
        """One epoch. A probed copy's batches come with where and how they were made; a loader
        that could not be probed gives waits, steps and samples (read off the batch) only."""
        ledger, rows, clock = self.ledger, self.recorder.rows, time.monotonic
        try:
            yield from self._epoch(mark, iterator, probed, ledger, rows, clock)
        finally:  # a loop that breaks off frees its workers with the generator, as before
            if self._iterator is iterator:
                self._iterator = None
            if not self._kept(iterator):  # (its workers are gone already if it ran out)
                t_close = clock()
                _shutdown(iterator)
                ledger.closed(clock() - t_close)

    def _kept(self, iterator: Any) -> bool:
        """Whether ``iterator`` is one a loader keeps for its next epoch (persistent workers):
        the probed copy's, or the job's own loader's where it could not be probed."""
        return iterator is self._own or any(
            held is not None and getattr(held, "_iterator", None) is iterator
            for held in (self.probed, self.loader))

    def _epoch(self, mark: EpochMark, iterator, probed: bool, ledger, rows, clock):
        handover = Handover(rows, self.ahead)
        while True:
            try:
                item, t_request, t_ready, seq = ledger.next_batch(iterator, mark)
            except StopIteration:
                handover.end(clock() - ledger.t0)
                return
            handover.arrived()
            if probed:
                batch, meta = item
            else:
                batch, meta = item, unprobed_meta(samples_in(item))
            ledger.handed(mark, t_ready, meta)
            self._handed = seq  # the batch loader.to() copies
            try:
                yield batch
            except BaseException:  # also the last batch of a loop that breaks off (closed)
                rows.append(ledger.row(seq, mark.epoch, t_request, t_ready, clock(), meta))
                raise
            handover.taken(ledger.row(seq, mark.epoch, t_request, t_ready, clock(), meta))

    def _tuned_batches(self, search: Search, mark: EpochMark) -> Iterator[Any]:
        """One epoch while tuning in place. The epoch's batches are drawn from the loader's own
        batch sampler once, as DataLoader would (its sampler first, then the workers' base
        seed, from the loader's generator: later epochs draw exactly as without the tool);
        each setting's loader is handed the batches not yet taken, so a switch between two
        batches repeats and skips nothing and keeps the order."""
        mark.asked(time.monotonic())  # drawing the plan, starting the workers: waited for
        loader = self.loader
        assert loader.batch_sampler is not None  # in_place_blocker turns such loaders away
        sampler_iter = iter(loader.batch_sampler)
        base_seed = int(torch.empty((), dtype=torch.int64).random_(
            generator=loader.generator).item())
        plan = list(sampler_iter)
        ledger, rows, clock = self.ledger, self.recorder.rows, time.monotonic
        taken, segment = 0, 0
        handover = Handover(rows, self.ahead)
        ran_out = False  # the epoch's end came (not a loop breaking off)
        search.epoch_started(mark.epoch)
        source = self._open(search, plan, 0, search.current, base_seed, segment)
        switched: float | None = None  # a switch's start: the next batch waits from there
        opened: float | None = None  # ...and the new loader's: its start-up, for the search
        try:
            while taken < len(plan):
                try:
                    (batch, meta), t_request, t_ready, seq = ledger.next_batch(source, mark,
                                                                               switched)
                except StopIteration:
                    ran_out = True
                    return
                except Exception as exc:  # noqa: BLE001 - a tried setting failed
                    setting = search.current
                    if setting == search.baseline or exc is not ledger.next_error:
                        raise  # the job's own settings (or not the loader's error): as is
                    # Each setting fails once at most (then it is dropped; a failing best gives
                    # way to the job's own), so a bad sample ends at the job's own error.
                    fallback = search.setting_failed(setting, f"{type(exc).__name__}: {exc}")
                    self._log_decisions(search)
                    switched = switched or clock()
                    _shutdown(source)
                    opened = clock()
                    ledger.opening = True  # its first batch carries the new workers' start-up
                    segment += 1
                    source = self._open(search, plan, taken, fallback, base_seed, segment)
                    continue
                switched = None
                ledger.opening = False  # a switched loader's first batch came
                handover.arrived()
                ledger.handed(mark, t_ready, meta)
                self._handed = seq  # the batch loader.to() copies
                try:
                    yield batch
                except BaseException:  # also the last batch of a loop that breaks off
                    rows.append(ledger.row(seq, mark.epoch, t_request, t_ready, clock(), meta))
                    raise
                t_back = clock()
                handover.taken(ledger.row(seq, mark.epoch, t_request, t_ready, t_back, meta))
                taken += 1
                # (not the old loader's shutdown: the job with one setting never pays that)
                switch = search.after_batch(samples_of(meta), t_back - (opened or t_request))
                opened = None
                # (A node's leader finishes when the node switches to its choice, after the
                # decision was logged: tune/node.py.)
                if len(search.decisions) > self._logged or (search.finished
                                                             and not self._saved):
                    self._log_decisions(search)
                if switch is not None and taken < len(plan):
                    switched = clock()  # stopping one loader, starting the next: the loop waits
                    _shutdown(source)
                    opened = clock()
                    ledger.opening = True  # its first batch carries the new workers' start-up
                    segment += 1
                    source = self._open(search, plan, taken, switch, base_seed, segment)
            ran_out = True
        finally:
            t_close = clock()
            _shutdown(source)
            ledger.closed(clock() - t_close)
            handover.end(clock() - ledger.t0 if ran_out else None)

    def _open(self, search: Search, plan: list[Any], start: int, setting: Setting,
              base_seed: int, segment: int) -> Iterator[Any]:
        """``_segment``, and if a tried setting cannot even start, the best one so far (or the
        job's own) instead: tuning must never be what stops training."""
        while True:
            try:
                return self._segment(search, plan, start, setting, base_seed, segment)
            except Exception as exc:  # noqa: BLE001
                if setting == search.baseline:
                    raise  # the job's own settings: its own error, as without the tool
                setting = search.setting_failed(setting, f"{type(exc).__name__}: {exc}")
                self._log_decisions(search)

    def _segment(self, search: Search, plan: list[Any], start: int, setting: Setting,
                 base_seed: int, segment: int) -> Iterator[Any]:
        """An iterator over ``plan[start:]`` with ``setting``, probed like the watched copy."""
        loader = self.loader
        # Workers seeded from this epoch's base seed, not from the loader's generator: that one
        # is left to the sampler, so later epochs shuffle as without the tool.
        kwargs = copy_kwargs(loader, setting.num_workers, setting.prefetch_factor, False,
                             torch.Generator().manual_seed(base_seed + 1_000_003 * segment))
        # (remembered by position with workers: a late batch's indices, stalls.py)
        kwargs.update(batch_sampler=RecordingBatchSampler(
            plan[start:], setting.num_workers * (setting.prefetch_factor or 2))
            if setting.num_workers else plan[start:],
            collate_fn=TimedCollate(loader.collate_fn, True))
        if setting.num_workers:  # a worker stuck before its first fetch is named too
            kwargs["worker_init_fn"] = OfferingStack(loader.worker_init_fn)
        search.loader_started()
        with warnings.catch_warnings():  # torch's "suggested max number of worker": the
            # search tries such counts on purpose and judges them by the loop's own rate
            warnings.filterwarnings("ignore", message=".*suggested max number of worker")
            self._iterator = iter(DataLoader(wrap_dataset(loader.dataset), **kwargs))
            return self._iterator

    def _log_decisions(self, search: Search) -> None:
        """New lines of the search's log: into the run (shown live) and on stderr; at the end,
        the chosen settings printed and saved."""
        for decision in search.decisions[self._logged:]:
            self.recorder.events.append(protocol.Trial(decision))
            rate = (f"{decision.samples_per_s:.1f} samples/s" if decision.samples_per_s
                    else "no rate")
            ci = f" ±{decision.rate_ci:.0%}" if decision.rate_ci is not None else ""
            _say(f"{self.name}: num_workers={decision.num_workers}: {rate}{ci}: "
                 f"{decision.verdict}")
        self._logged = len(search.decisions)
        if search.finished and not self._saved:
            self._saved = True
            self._save_choice(search)

    def _save_choice(self, search: Search) -> None:
        best = search.best
        chosen = best.setting if best is not None else search.baseline
        rate = best.samples_per_s if best is not None else None
        interval = best.interval() if best is not None else None
        recommended = {"num_workers": chosen.num_workers, "pin_memory": self.loader.pin_memory,
                       "prefetch_factor": chosen.prefetch_factor if chosen.num_workers else None,
                       "persistent_workers": bool(self.loader.persistent_workers
                                                  and chosen.num_workers)}
        config = self.config.replace(**{k: v for k, v in recommended.items()})
        result = TuneResult(
            status="ok", target=self.script, recommended=recommended,
            snippet=frameworks.snippet(self.framework, config), expected_samples_per_s=rate,
            uncertainty_pct=100 * interval if interval else None,
            baseline={"source": "the job's own settings", **asdict(search.baseline)},
            reasons=tuple(d.verdict for d in search.decisions))
        # From the next epoch on, the chosen settings run as a probed copy of the job's loader
        # (its own persistent_workers kept), drawing from its sampler and generator as before.
        loader = self.loader
        # The count was measured to pay in this very job: torch's generic warning about counts
        # above its suggestion would otherwise repeat at every epoch.
        warnings.filterwarnings("ignore", message=".*suggested max number of worker")
        chosen_loader = DataLoader(loader.dataset, batch_sampler=loader.batch_sampler,
                                   **copy_kwargs(loader, chosen.num_workers,
                                                 chosen.prefetch_factor,
                                                 bool(recommended["persistent_workers"]),
                                                 loader.generator))
        self.probed = instrumented(chosen_loader)[0] or self.probed
        if isinstance(search, FollowerSearch):  # the node's leader saves it, once
            return
        try:
            with open_private(self.settings_out) as f:
                json.dump(settings_file(result), f, indent=2)
            where = f"saved to {self.settings_out}"
        except OSError as exc:
            where = f"not saved ({exc})"
        _say(f"{self.name}: tuned in place: {result.snippet} ({where}; "
             "dataloader_tuner.load_settings reads it)")

    # -- once, on the recorder's thread ------------------------------------------------------

    def _running_setting(self) -> Setting:
        """The setting the job's batches come from now: the search's, or the loader's own."""
        if self.search is not None:
            return self.search.current
        return Setting(self.loader.num_workers, self.loader.prefetch_factor)

    def _ready(self) -> protocol.Ready:
        dataset = self.loader.dataset
        counting = counting_rules(self.config)
        if self.unprobed_reason:
            counting = {"samples": "the leading dimension of each batch (" + self.unprobed_reason
                        + ")", "bytes": "not read"}
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
            consumer={"kind": "training_loop", "step_ms": None, "framework": self.framework},
            system=machine,
            warmup_batches=self.config.warmup_batches,
            counting=counting,
            torch=torch.__version__,
            ranks_on_node=self.rank.local_world_size if self.rank else 1,
        )


class Handover:
    """An epoch's rows on their way to the recorder. Where a wrapper asks the loader one batch
    ahead of the loop (``ahead``: accelerate), each row is held until the next batch or the
    epoch's end came, so that the end's wait lands on the last batch (``ended``)."""

    __slots__ = ("rows", "ahead", "held")

    def __init__(self, rows: list, ahead: bool) -> None:
        self.rows, self.ahead, self.held = rows, ahead, None

    def arrived(self) -> None:
        """The next batch came: the row held is complete."""
        if self.held is not None:
            self.rows.append(self.held)
            self.held = None

    def taken(self, row: Any) -> None:
        """The loop is back for another batch after ``row``'s."""
        if self.ahead:
            self.held = row
        else:
            self.rows.append(row)

    def end(self, t_end: float | None) -> None:
        """The epoch ran out at ``t_end`` (since the run's start; None: it broke off)."""
        if self.held is not None:
            self.rows.append(ended(self.held, t_end) if t_end is not None else self.held)
            self.held = None


def ended(last: Any, t_end: float) -> Any:
    """The epoch's last row, its wait taking in the epoch's end: a wrapper that asks one batch
    ahead (accelerate) asks for the end (the workers shutting down) before it hands the last
    batch over, inside the loop's wait (``t_end``: since the run's start)."""
    return last._replace(wait_s=last.wait_s + max(
        t_end - (last.t_request + last.wait_s + last.step_s), 0.0))


def in_place_blocker(loader: DataLoader, probed: DataLoader | None) -> str | None:
    """Why this loader cannot be tuned in place, or None."""
    if probed is None:
        return "the loader is not a plain DataLoader"
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


def _is_cuda(device: Any) -> bool:
    return torch.device(device).type == "cuda"


def _inherited(copy: DataLoader) -> tuple:
    """What workers forked now would inherit that their probe reads (~70 us to read here):
    the modules loaded (a new extension module can bring a thread pool), the thread variables
    and the dataset's random generators (which it holds, not their states)."""
    dataset = getattr(copy.dataset, "inner", copy.dataset)
    return (len(sys.modules), tuple(sorted(threads.pool_env().items())),
            tuple(sorted(probes.rng_state(dataset))))


def _shutdown(iterator) -> None:
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _config(loader: DataLoader) -> LoaderConfig:
    try:
        return config_of(loader)
    except Exception:  # noqa: BLE001 - an odd loader: record it with what is certain
        return LoaderConfig(batch_size=getattr(loader, "batch_size", None),
                            num_workers=int(getattr(loader, "num_workers", 0) or 0))
