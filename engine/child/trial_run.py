"""One trial of the offline tune: a DataLoader of one setting measured in this process (the
engine's child) until its samples/s is known, and the runner that measures the tune's trials in
turn: each reported as it ends, beside the node's companions, cut at the user's time limit,
with a beat per batch for the child's watchdog."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from typing import Any, Callable

import psutil

from dataloader_tuner.analyse import metrics
from dataloader_tuner.analyse.hotspots import SampledProfile
from dataloader_tuner.child.measure import Measurement
from dataloader_tuner.record.cards import Consumer
from dataloader_tuner.child.target import ResolvedTarget
from dataloader_tuner.config import LoaderConfig, TunedSettings
from dataloader_tuner.instrument import sampler, threads
from dataloader_tuner.instrument.heap import FaultsSinceFirstBatch
from dataloader_tuner.instrument.resources import BusiestThread
from dataloader_tuner.record.columns import BatchColumns
from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.child.companions import Companions, TrialOrder
from dataloader_tuner.tune.plan import FORK_S, SPAWN_S
from dataloader_tuner.tune.time_limit import TimeLimit
from dataloader_tuner.tune.trial_rules import (HARD_CAP_S, MIN_STEADY_BATCHES, TARGET_CI,
                                         epoch_block, trial_cap_s, trial_from_batches,
                                         window_s)

PREWARM_S = 0.4


def workers_private_mb() -> float | None:
    """Mean memory per worker not shared with the parent (RSS minus shared pages)."""
    sizes = []
    for child in psutil.Process().children():
        try:
            info = child.memory_info()
            sizes.append((info.rss - getattr(info, "shared", 0)) / 2**20)
        except psutil.Error:
            pass
    return sum(sizes) / len(sizes) if sizes else None


def worker_threads_read(seen: dict[int, dict[str, Any]],
                        threads_since: threads.ThreadsSinceFirstBatch) -> dict[str, Any]:
    """The trial's workers' thread pools (their probes) and how their threads shared their CPU
    since each made its first batch, as TrialResult's fields (NOTE [ Threads per worker ])."""
    pools: dict[str, int] = {}
    for probe in seen.values():
        for name, size in (probe.get("pools") or {}).items():
            pools[name] = max(pools.get(name, 0), size)
    uses = [use for use in map(threads_since.use, seen) if use is not None]
    return {"worker_pools": pools or None,
            "helper_cpu_share": (round(statistics.median(u.helper_share for u in uses), 3)
                                 if uses else None),
            "busy_threads": int(statistics.median(u.busy_threads for u in uses)) if uses
            else None}


class TrialClock:
    """When a trial has measured enough: at least MIN_STEADY_BATCHES steady batches over its
    window and a samples/s known to TARGET_CI, or its time cap: the window, for fast batches
    (NOTE [ Windows of a fixed length for fast batches ], tune/trial_rules.py). The cap grows with
    the batch time seen so far, so slow batches still get their 20, up to HARD_CAP_S. Read from
    the measuring loop's columns as it runs, in C where it can: its time is the trial's."""

    def __init__(self, columns: BatchColumns, warmup: int, block: int,
                 window: float, limit_s: float | None = None,
                 on_batches: Callable[[], None] | None = None,
                 share_s: float | None = None, most_steady: int | None = None) -> None:
        """``limit_s``: what the user's time limit leaves this trial (a hard cut);
        ``on_batches()``: told when batches came since it last asked (the child's watchdog);
        ``share_s``: its share of the time (TimeLimit.share), kept once its rate has the
        batches it needs: a trial cut before them is too short to believe; ``most_steady``:
        stop after this many steady batches (a trial read for its page faults, not its rate)."""
        self.columns, self.warmup, self.block = columns, warmup, block
        self.window, self.limit_s, self.share_s = window, limit_s, share_s
        self.most_steady = most_steady
        self.on_batches = on_batches
        self.started = time.monotonic()
        self.checked_at = 0
        self.seen = 0
        self.samples: list[int] = []  # the steady batches' sample counts, as read so far

    def enough(self) -> bool:
        columns, warmup = self.columns, self.warmup
        n = len(columns)
        if n > self.seen and self.on_batches is not None:
            self.on_batches()
        self.seen = n
        now = time.monotonic()
        elapsed = now - self.started
        if self.past_cap(now, n) or (self.limit_s is not None and elapsed >= self.limit_s):
            return True
        steady = n - warmup
        if self.most_steady is not None and steady >= self.most_steady:
            return True
        if steady < MIN_STEADY_BATCHES or columns.t_ready(n - 1) - columns.t_ready(warmup - 1) \
                < self.window:
            return False
        if self.share_s is not None and elapsed >= self.share_s:
            return True
        if steady < self.checked_at * 1.1:  # the interval costs O(n): not on every batch
            return False
        self.checked_at = steady
        self.samples += columns.samples(warmup + len(self.samples), n)
        block = epoch_block(columns.epoch_lengths(warmup), steady, self.block)
        ci = metrics.ends_rate_interval(self.samples, columns.ends(warmup - 1, n), block)
        return ci is not None and ci <= TARGET_CI

    def past_cap(self, now: float, n: int) -> bool:
        """Whether the trial ran to its cap, counted from its first batch: the workers'
        start-up is not a batch's time. Counted from ``iter()``, a trial whose first batch came
        after its window was cut at that batch (the first batch is checked against HARD_CAP_S:
        a time per batch needs two batches): workers spawned
        fresh for the freed-memory check, importing torch and a dataset's libraries for ~5 s
        on a slow day, never reached a steady state, and nothing was decided."""
        if self.window <= PREWARM_S:
            return now - self.started > self.window
        if n < 2:
            return now - self.started > HARD_CAP_S
        first = self.columns.t0 + self.columns.t_ready(0)
        per_batch = (self.columns.t_ready(n - 1) - self.columns.t_ready(0)) / (n - 1)
        return now - first > trial_cap_s(per_batch, self.warmup, self.block, self.window)


def measure_trial(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
                  phase: str, repeat: int, window: float | None = None,
                  attempts: list[str] | None = None,
                  companions: Companions | None = None, limit_s: float | None = None,
                  share_s: float | None = None,
                  on_batches: Callable[[], None] | None = None,
                  rows_out: list[BatchRecord] | None = None,
                  stacks: SampledProfile | None = None,
                  most_steady: int | None = None) -> TrialResult | None:
    """One steady-state measurement, long enough to believe (see TrialClock). ``attempts``
    collects a line per trial that reached no steady state, for the error that explains it.
    ``companions``: the node's other ranks, running the same settings all the while.
    ``limit_s``: cut it there (the user's time limit); ``share_s``: stop there once its rate
    has its batches (TrialClock); ``on_batches``: called as batches come (the
    child's watchdog: a trial of slow batches is progress, not a hang); ``rows_out``: the
    trial's rows are added to it at its end; ``stacks``: where the sampled stacks of its
    processes go (instrument/sampler.py, where the run samples them); ``most_steady``: stop
    after that many steady batches (TrialClock); ``window``: how long fast batches are
    measured (None: the phase's, tune/trial_rules.py's window_s)."""
    warmup = config.warmup_batches
    columns = BatchColumns()
    others = measurement = None
    running: Companions | None = None  # the companions, once they run this trial's settings
    try:
        if companions is not None:
            companions.start(TunedSettings.of(config))
            running = companions
        clock = TrialClock(columns, warmup, max(config.num_workers, 1),
                           window_s(phase) if window is None else window, limit_s,
                           on_batches, share_s, most_steady)
        cpu_before = time.process_time()
        busiest = BusiestThread(psutil.Process())  # what takes the batches one at a time
        seen: dict[int, dict[str, Any]] = {}  # worker pid -> what its first fetch revealed
        threads_since = threads.ThreadsSinceFirstBatch()
        faults_since = FaultsSinceFirstBatch()

        def worker_seen(pid: int, worker_id: int, probe: dict[str, Any] | None) -> None:
            if worker_id >= 0:  # not the main process
                seen[pid] = probe or {}
                threads_since.start(pid)
                faults_since.start(pid)

        measurement = Measurement(resolved, config, consumer, HARD_CAP_S, columns,
                                  clock.enough, on_worker=worker_seen,
                                  on_profile=(None if stacks is None else
                                              lambda pid, worker, sampled: stacks.add(pid, sampled)))
        measurement.run()
        own = sampler.running()
        if stacks is not None and own is not None:  # this process's (its fetch at 0 workers)
            stacks.add(os.getpid(), own.take())
        main_cpu = time.process_time() - cpu_before
        main_thread_cpu = busiest.seconds()
        private = workers_private_mb() if config.num_workers else None
        workers_threads = worker_threads_read(seen, threads_since)  # while they still run
        worker_faults = faults_since.per_batch(len(columns) - len(seen))  # after each one's first
    finally:
        try:
            if running is not None:  # the companions stopped before this loader's workers are
                steady = metrics.steady_state(columns.rows(), warmup)
                t0 = measurement.t0 if measurement is not None else time.monotonic()
                span = ((t0 + steady.start, t0 + steady.end) if steady
                        else (t0, time.monotonic()))
                others = running.stop(*span)
        finally:
            if measurement is not None:
                measurement.close()
    seconds = time.monotonic() - clock.started
    records = columns.rows()  # built now: NOTE [ Rows built off the loop ]
    if rows_out is not None:
        rows_out.extend(records)
    trial = trial_from_batches(
        records, warmup,
        num_workers=config.num_workers, prefetch_factor=config.prefetch_factor,
        persistent_workers=config.persistent_workers, pin_memory=config.pin_memory,
        batch_size=config.batch_size, seconds=seconds,
        has_consumer=consumer.kind != "none", main_cpu_s=main_cpu, worker_private_mb=private,
        main_thread_cpu_s=main_thread_cpu,
        phase=phase, repeat=repeat, in_order=config.in_order,
    )
    if trial is not None:
        trial = replace(trial, worker_threads=config.worker_threads,
                        keep_freed_memory=config.keep_freed_memory,
                        worker_faults=worker_faults, **workers_threads)
    if trial is not None and companions is not None and others is not None:
        trial = replace(trial, ranks_measured=1 + companions.count,
                        node_samples_per_s=others.node_total(trial.samples_per_s))
    if trial is None and attempts is not None and phase != "prewarm":
        each = f", {seconds / len(records):.2f} s per batch" if records else ""
        attempts.append(f"num_workers={config.num_workers}: {len(records)} batch(es) in "
                        f"{seconds:.1f} s{each}, {warmup} of them warm-up")
    return trial


def start_s(config: LoaderConfig) -> float:
    """Seconds before a trial of ``config`` can make its first batch: a fresh interpreter's
    import for spawned workers (the freed-memory check's: a --budget-s 10 tune began one with
    0.3 s left and ran 1.7 s over), a fork's otherwise."""
    if not config.num_workers:
        return 0.0
    return SPAWN_S if config.multiprocessing_context == "spawn" else FORK_S


class TrialRunner:
    """Measures the tune's trials one after another: each reported as it ends (``on_trial``),
    run beside the node's ``companions``, cut at what ``time_limit`` leaves it, and every batch
    told to ``on_batches`` (the child's watchdog counts a trial of slow batches as progress)."""

    def __init__(self, resolved: ResolvedTarget, consumer: Consumer,
                 on_trial: Callable[[TrialResult], None], time_limit: TimeLimit,
                 on_batches: Callable[[], None] | None = None,
                 companions: Companions | None = None) -> None:
        self.resolved, self.consumer, self.on_trial = resolved, consumer, on_trial
        self.time_limit, self.on_batches, self.companions = time_limit, on_batches, companions
        self.stacks = SampledProfile()  # every trial's sampled stacks, where sampled
        self.attempts: list[str] = []  # the search's trials that reached no steady state

    def measure(self, config: LoaderConfig, phase: str, repeat: int = 0, report: bool = True,
                search: bool = False, share_s: float | None = None,
                most_steady: int | None = None, elsewhere: Companions | None = None
                ) -> TrialResult | None:
        """One trial of ``config``; ``share_s``: its share of the time (TimeLimit.share): of a
        user's limit, a hard cut; of the tune's aim, where it stops once its rate has the
        batches it needs (NOTE [ A tune's aim ], plan.py); ``most_steady``: its steady
        batches at most (TrialClock); ``elsewhere``: a companion that measures it alone, in
        its own process (NOTE [ A claim from two processes ], child/claiming.py)."""
        hard = self.time_limit.budget_s is not None
        left = self.time_limit.left()
        if left is not None and left <= start_s(config):
            # the limit is spent, or would be before the workers' first batch (a trial is cut
            # only once a batch comes): none is started
            self.time_limit.reached = True
            return None
        limit_s = _least(self.time_limit.left(), share_s if hard else None)
        if elsewhere is not None:
            trial = elsewhere.trial(TrialOrder(TunedSettings.of(config), phase, repeat,
                                               limit_s=limit_s,
                                               share_s=None if hard else share_s))
            trial = replace(trial, second_process=True) if trial is not None else None
        else:
            trial = measure_trial(self.resolved, config, self.consumer, phase, repeat,
                                  attempts=self.attempts if search else None,
                                  companions=self.companions, limit_s=limit_s,
                                  share_s=None if hard else share_s,
                                  on_batches=self.on_batches, stacks=self.stacks,
                                  most_steady=most_steady)
        if self.time_limit.left() == 0:  # cut at the limit
            self.time_limit.reached = True
        if trial is not None and report:
            self.on_trial(trial)
        return trial

    def measuring(self, config: LoaderConfig, phase: str, share_s: float | None = None
                  ) -> Callable[[int], TrialResult | None]:
        """``measuring(config, phase)(repeat)`` runs one trial of ``config`` and reports it;
        ``share_s``: its share of the time, as ``measure`` takes it."""
        return lambda repeat: self.measure(config, phase, repeat, share_s=share_s)

    def first_batch_s(self, config: LoaderConfig) -> float | None:
        """An untimed pass of ``config`` (the first batches in a fresh process pay for page
        faults, allocator growth and lazy imports: kept out of the first probe); returns its
        last batch's time, the plan's first estimate of a batch (plan.py)."""
        rows: list[BatchRecord] = []
        measure_trial(self.resolved, config, self.consumer, "prewarm", 0,
                      window=PREWARM_S, limit_s=self.time_limit.left(),
                      on_batches=self.on_batches, rows_out=rows)
        return rows[-1].wait_s + rows[-1].step_s if rows else None


def _least(*limits: float | None) -> float | None:
    """The tightest of the limits given (None: no limit)."""
    given = [limit for limit in limits if limit is not None]
    return min(given) if given else None
