"""Tuning inside the engine's child process: real trials for the search in tuner.py.

All trials run in the one child (torch is imported once), each with a fresh DataLoader whose
workers are shut down before the next trial starts.

NOTE [ Persistent workers while searching ]

    The search's trials keep their workers across epochs (persistent_workers=True): trials of a
    small dataset cross epochs, and restarting many workers at each would be charged to the
    count itself. Without it a memmap store's search stopped at 21 workers, 0.73 of the rate of
    the 32 that a grid of persistent loaders found best. What restarting costs a setting is
    judged on its own afterwards (persistent_decision).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Callable

import psutil
import torch

from dataloader_tuner.analyse import metrics
from dataloader_tuner.instrument import threads
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.errors import RunError
from dataloader_tuner.tune import claim, order
from dataloader_tuner.tune.companions import Companions
from dataloader_tuner.child.dataset_card import dataset_length
from dataloader_tuner.child.measure import Consumer, Measurement
from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.protocol import RunRequest
from dataloader_tuner.system import SystemSnapshot
from dataloader_tuner.tune.recommend import Limits
from dataloader_tuner.settings import recommended_config, snippet_names
from dataloader_tuner.child.target import ResolvedTarget
from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.trials import MIN_STEADY_BATCHES, TARGET_CI, summarize_trial
from dataloader_tuner.tune.thread_pools import ThreadsDecision
from dataloader_tuner.tune.tuner import NoSteadyState, Tuner, TrialSpec, TuneOutcome

TUNED_KEYS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "in_order",
              "worker_threads")
MIN_WINDOW_S = 0.6
PREWARM_S = 0.4
MAX_TRIAL_S = 4.0  # a trial's time cap for fast batches...
HARD_CAP_S = 30.0  # ...which grows with the batch time up to this
CAP_BATCHES = 1.5 * MIN_STEADY_BATCHES  # ...to leave room for this many batches after warm-up


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


def worker_threads_read(seen: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The trial's workers' thread pools (their probes) and how their threads shared their CPU,
    as TrialResult's fields (NOTE [ Threads per worker ])."""
    pools: dict[str, int] = {}
    for probe in seen.values():
        for name, size in (probe.get("pools") or {}).items():
            pools[name] = max(pools.get(name, 0), size)
    uses = []
    for pid in seen:
        try:
            use = threads.thread_use(psutil.Process(pid))
        except psutil.Error:
            use = None
        if use is not None:
            uses.append(use)
    return {"worker_pools": pools or None,
            "helper_cpu_share": (round(statistics.median(u.helper_share for u in uses), 3)
                                 if uses else None),
            "busy_threads": int(statistics.median(u.busy_threads for u in uses)) if uses
            else None}


class TrialClock:
    """When a trial has measured enough: at least MIN_STEADY_BATCHES steady batches over
    MIN_WINDOW_S and a samples/s known to TARGET_CI, or its time cap. The cap grows with the
    batch time seen so far, so slow batches still get their 20, up to HARD_CAP_S."""

    def __init__(self, records: list[BatchRecord], warmup: int, block: int,
                 max_trial_s: float) -> None:
        self.records, self.warmup, self.block = records, warmup, block
        self.max_trial_s = max_trial_s
        self.started = time.monotonic()
        self.checked_at = 0

    def enough(self) -> bool:
        records, warmup = self.records, self.warmup
        elapsed = time.monotonic() - self.started
        if elapsed > self.cap(elapsed):
            return True
        steady = len(records) - warmup
        if steady < MIN_STEADY_BATCHES or records[-1].t_ready - records[warmup - 1].t_ready \
                < MIN_WINDOW_S:
            return False
        if steady < self.checked_at * 1.1:  # the interval costs O(n): not on every batch
            return False
        self.checked_at = steady
        ci = metrics.rate_interval(records, warmup, self.block)
        return ci is not None and ci <= TARGET_CI

    def cap(self, elapsed: float) -> float:
        if self.max_trial_s <= PREWARM_S or not self.records:
            return self.max_trial_s
        per_batch = elapsed / len(self.records)
        # Room for the interval's three blocks of a worker round each, too (metrics.py).
        room = self.warmup + max(CAP_BATCHES, 3 * self.block)
        return min(max(self.max_trial_s, per_batch * room), HARD_CAP_S)


def measure_trial(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
                  phase: str, repeat: int, max_trial_s: float = MAX_TRIAL_S,
                  attempts: list[str] | None = None,
                  companions: Companions | None = None) -> TrialResult | None:
    """One steady-state measurement, long enough to believe (see TrialClock). ``attempts``
    collects a line per trial that reached no steady state, for the error that explains it.
    ``companions``: the node's other ranks, running the same settings all the while."""
    warmup = config.warmup_batches
    records: list[BatchRecord] = []
    others = measurement = None
    running: Companions | None = None  # the companions, once they run this trial's settings
    try:
        if companions is not None:
            companions.start({key: getattr(config, key) for key in TUNED_KEYS})
            running = companions
        clock = TrialClock(records, warmup, max(config.num_workers, 1), max_trial_s)
        cpu_before = time.process_time()
        seen: dict[int, dict[str, Any]] = {}  # worker pid -> what its first fetch revealed

        def worker_seen(pid: int, worker_id: int, probe: dict[str, Any] | None) -> None:
            if worker_id >= 0:  # not the main process
                seen[pid] = probe or {}

        measurement = Measurement(resolved, config, consumer, HARD_CAP_S, records.append,
                                  clock.enough, on_worker=worker_seen)
        measurement.run()
        main_cpu = time.process_time() - cpu_before
        private = workers_private_mb() if config.num_workers else None
        workers_threads = worker_threads_read(seen)  # while the workers still run
    finally:
        try:
            if running is not None:  # the companions stopped before this loader's workers are
                steady = metrics.steady_state(records, warmup)
                t0 = measurement.t0 if measurement is not None else time.monotonic()
                window = ((t0 + steady.start, t0 + steady.end) if steady
                          else (t0, time.monotonic()))
                others = running.stop(*window)
        finally:
            if measurement is not None:
                measurement.close()
    seconds = time.monotonic() - clock.started
    trial = summarize_trial(
        records, warmup,
        num_workers=config.num_workers, prefetch_factor=config.prefetch_factor,
        persistent_workers=config.persistent_workers, pin_memory=config.pin_memory,
        batch_size=config.batch_size, seconds=seconds,
        has_consumer=consumer.kind != "none", main_cpu_s=main_cpu, worker_private_mb=private,
        phase=phase, repeat=repeat, in_order=config.in_order,
    )
    if trial is not None:
        trial = replace(trial, worker_threads=config.worker_threads, **workers_threads)
    if trial is not None and companions is not None and others is not None:
        trial = replace(trial, ranks_measured=1 + companions.count,
                        node_samples_per_s=others.node_total(trial.samples_per_s))
    if trial is None and attempts is not None and phase != "prewarm":
        each = f", {seconds / len(records):.2f} s per batch" if records else ""
        attempts.append(f"num_workers={config.num_workers}: {len(records)} batch(es) in "
                        f"{seconds:.1f} s{each}, {warmup} of them warm-up")
    return trial


def run_tune(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
             system: SystemSnapshot,
             request: RunRequest, on_trial: Callable[[TrialResult], None]) -> dict[str, Any]:
    """Search, then measure the module's own settings as the baseline; returns the document."""
    limits = Limits.from_system(system, request.local_world_size, request.max_workers,
                                dataset_length(resolved.dataset))
    search_config = config.replace(num_workers=0, pin_memory=False, prefetch_factor=None,
                                   persistent_workers=False)

    attempts: list[str] = []

    # threads against the cores this rank has (a quota counted), not less the load now
    threads_decision = ThreadsDecision(system.cores / limits.local_world_size)
    threads_of: dict[int, int | None] = {}  # a worker count stays on its first trial's setting

    def measure(spec: TrialSpec) -> TrialResult | None:
        # NOTE [ Persistent workers while searching ]: the restart cost is judged apart.
        trial_config = search_config.replace(
            num_workers=spec.num_workers, persistent_workers=spec.num_workers > 0,
            worker_threads=threads_of.get(spec.num_workers, threads_decision.worker_threads)
            if spec.num_workers else None)
        trial = measure_trial(resolved, trial_config, consumer, spec.phase, spec.repeat,
                              attempts=attempts, companions=companions)
        if trial is None:
            return None
        # NOTE [ Deciding threads during the search ] (tune/thread_pools.py)
        trial = threads_decision.check(
            trial, lambda threads, repeat: measure_trial(
                resolved, trial_config.replace(worker_threads=threads), consumer, spec.phase,
                repeat, companions=companions), on_trial)
        threads_of.setdefault(spec.num_workers, trial.worker_threads)
        return trial

    started = time.monotonic()
    # The first batches in a fresh process pay for page faults, allocator growth and lazy
    # imports; an untimed pass keeps that out of the first probe.
    measure_trial(resolved, search_config, consumer, "prewarm", 0, max_trial_s=PREWARM_S)
    # A node of N ranks: every trial runs N loaders at once (companions.py).
    companions = (Companions(request.target, request.settings, request.step_ms,
                             request.local_world_size - 1)
                  if request.local_world_size > 1 else None)
    try:
        tuner = Tuner(measure, limits, system, has_consumer=consumer.kind != "none",
                      step_on_cpu=consumer.kind == "train_step",
                      budget_s=float(request.budget_s),
                      batch_size=config.batch_size, on_trial=on_trial)
        try:
            outcome = tuner.run()
        except NoSteadyState as exc:
            raise no_steady_state_error(attempts, config) from exc
        pick = [t for t in outcome.trials if t.num_workers == outcome.recommendation.kwargs[
            "num_workers"] and t.phase not in claim.OUTSIDE_SEARCH]
        outcome = replace(outcome, trials=[*outcome.trials, *threads_decision.others],
                          recommendation=threads_decision.recommend(outcome.recommendation,
                                                                    pick))
        source = _baseline_source(resolved, request)
        final = recommended_config(config, outcome.recommendation.kwargs)
        final, outcome = _delivery_order(resolved, final, consumer, outcome, on_trial,
                                         request.keep_order, companions)
        if claim.same_settings(final, config):
            outcome = _measure_final(resolved, config, consumer, outcome, on_trial, companions)
            baseline = _baseline(resolved, config, consumer, outcome, on_trial, source,
                                 companions)
        else:
            outcome, baseline = _claim_at_end(resolved, config, final, consumer, outcome,
                                              on_trial, source, limits.dataset_length,
                                              companions)
    finally:
        if companions is not None:
            companions.close()
    return tune_document(outcome, baseline, config, time.monotonic() - started,
                         snippet_names(resolved, config))


def _measure_final(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
                   outcome: TuneOutcome, on_trial: Callable[[TrialResult], None],
                   companions: Companions | None = None) -> TuneOutcome:
    """Measure the recommendation with all its settings when the search did not (a deeper
    prefetch, workers restarted each epoch): the outcome, expecting what that measured."""
    rec = outcome.recommendation
    final = recommended_config(config, rec.kwargs)
    if not final.num_workers or any(t.key == final.tuned_key and t.phase != "baseline"
                                    for t in outcome.trials):
        return outcome  # the search measured exactly these settings
    trial = measure_trial(resolved, final, consumer, "final", 0, companions=companions)
    if trial is None:
        return outcome
    on_trial(trial)
    remeasured = replace(
        rec, expected_samples_per_s=trial.samples_per_s,
        uncertainty_pct=100.0 * trial.rate_ci if trial.rate_ci is not None else None,
        conclusive=trial.conclusive,
        reasons=rec.reasons + (f"Measured again with all the recommended settings: "
                               f"{trial.samples_per_s:.0f} samples/s; that is the figure "
                               "expected.",))
    return replace(outcome, trials=[*outcome.trials, trial], recommendation=remeasured)


def _measuring(resolved: ResolvedTarget, consumer: Consumer,
               on_trial: Callable[[TrialResult], None], companions: Companions | None
               ) -> Callable[[LoaderConfig, str], Callable[[int], TrialResult | None]]:
    """``measuring(config, phase)(repeat)`` runs one trial of ``config`` and reports it."""
    def measuring(trial_config: LoaderConfig, phase: str) -> Callable[[int], TrialResult | None]:
        def measure(repeat: int) -> TrialResult | None:
            trial = measure_trial(resolved, trial_config, consumer, phase, repeat,
                                  companions=companions)
            if trial is not None:
                on_trial(trial)
            return trial
        return measure
    return measuring


def _delivery_order(resolved: ResolvedTarget, final: LoaderConfig, consumer: Consumer,
                    outcome: TuneOutcome, on_trial: Callable[[TrialResult], None],
                    keep_order: bool, companions: Companions | None
                    ) -> tuple[LoaderConfig, TuneOutcome]:
    """The pick measured in order and out of order in turn where its batches' tail says that
    could pay (NOTE [ Out-of-order delivery ], order.py); in_order=False kept when faster."""
    rec = outcome.recommendation
    if keep_order and not final.in_order:  # the job's own in_order=False, overruled by it
        rec = replace(rec, kwargs={**rec.kwargs, "in_order": True}, reasons=(
            *rec.reasons, "in_order=True: you asked to keep the batches in order."))
        return final.replace(in_order=True), replace(outcome, recommendation=rec)
    # The pick's worker count as the search measured it (a batch's time in a worker does not
    # depend on the prefetch depth)
    at_pick = [t for t in outcome.trials if t.num_workers == final.num_workers
               and t.phase not in claim.OUTSIDE_SEARCH]
    try_it, why_not = order.worth_trying(at_pick, final, keep_order, torch.__version__)
    if not try_it:
        if why_not:
            outcome = replace(outcome, recommendation=replace(rec, reasons=(*rec.reasons,
                                                                             why_not)))
        return final, outcome
    measuring = _measuring(resolved, consumer, on_trial, companions)
    unordered_config = final.replace(in_order=False)
    ordered, unordered = claim.alternate(measuring(final, "in_order"),
                                         measuring(unordered_config, "out_of_order"))
    chosen, reason = order.decide(ordered, unordered)
    kwargs = {**rec.kwargs, "in_order": False} if chosen else rec.kwargs
    rec = replace(rec, kwargs=kwargs, reasons=(*rec.reasons, reason))
    trials = [*outcome.trials, *(t for t in ordered + unordered if t is not None)]
    return (unordered_config if chosen else final), replace(outcome, trials=trials,
                                                            recommendation=rec)


def _claim_at_end(resolved: ResolvedTarget, config: LoaderConfig, final: LoaderConfig,
                  consumer: Consumer, outcome: TuneOutcome,
                  on_trial: Callable[[TrialResult], None], source: str,
                  epoch_items: int | None, companions: Companions | None = None
                  ) -> tuple[TuneOutcome, dict[str, Any]]:
    """The user's settings and the pick measured in turn at the end of the tune; the claim and
    the pick's expected rate come from those trials only (NOTE [ Claims from the end of the
    tune ])."""
    measuring = _measuring(resolved, consumer, on_trial, companions)
    base_trials, pick_trials = claim.alternate(measuring(config, "baseline"),
                                               measuring(final, "final"))
    result = claim.end_claim(base_trials, pick_trials, epoch_items)
    rec, early = outcome.recommendation, outcome.trials
    warnings = list(rec.warnings)
    reasons = list(rec.reasons)
    if result.pick is not None and result.base is not None:
        for who, late, trial_config in (("The pick", result.pick, final),
                                        (f"Your settings ({source})", result.base, config)):
            found = claim.drift(claim.comparable(early, trial_config), late, who)
            if found is not None:
                warnings.append(found)
        reasons.append(claim.end_reason(result, source))
        rec = replace(rec, expected_samples_per_s=result.pick.rate,
                      uncertainty_pct=result.pick.uncertainty_pct,
                      conclusive=all(t.conclusive for t in result.pick.trials))
        cap = outcome.limits.memory_max_workers
        if result.slower and (cap is None or config.num_workers <= cap):
            # The end measured the user's settings faster (and they fit in memory): kept.
            reasons.insert(0, claim.keep_reason(result, source))
            rec = replace(rec, kwargs=own_kwargs(config),
                          expected_samples_per_s=result.base.rate,
                          uncertainty_pct=result.base.uncertainty_pct,
                          conclusive=all(t.conclusive for t in result.base.trials))
            result = result.kept()
    rec = replace(rec, reasons=tuple(reasons), warnings=tuple(warnings))
    trials = [*early, *(t for t in base_trials + pick_trials if t is not None)]
    base = result.base
    idles = [t.consumer_idle_frac for t in base.trials if t.consumer_idle_frac is not None] \
        if base is not None else []
    baseline = {
        "source": source,
        "config": config.to_json_dict(),
        # as measured; the claim charges each side its start-up per epoch (claim.py)
        "samples_per_s": base.measured_rate if base is not None else None,
        "charged_samples_per_s": base.rate if base is not None else None,
        "consumer_idle_frac": statistics.median(idles) if idles else None,
        **result.to_dict(),
    }
    return replace(outcome, trials=trials, recommendation=rec), baseline


def own_kwargs(config: LoaderConfig) -> dict[str, int | bool | None]:
    """The tuned settings of ``config`` as a recommendation states them (recommend.py)."""
    kwargs: dict[str, int | bool | None] = {"batch_size": config.batch_size,
                                            "num_workers": config.num_workers,
                                            "pin_memory": config.pin_memory}
    if config.num_workers:
        kwargs["persistent_workers"] = config.persistent_workers
        kwargs["prefetch_factor"] = config.prefetch_factor
        if config.worker_threads is not None:
            kwargs["worker_threads"] = config.worker_threads
    return kwargs


def no_steady_state_error(attempts: list[str], config: LoaderConfig) -> RunError:
    hint = ("the module's batch_sampler makes the batches" if config.batch_sampler is not None
            else "batch_size=None: each item the dataset yields is taken as a whole batch"
            if config.batch_size is None else
            f"batch_size={config.batch_size}: if the dataset already yields whole batches, "
            "set batch_size = None in the module (or --batch-size none)")
    return RunError(
        f"No trial reached a steady state: {'; '.join(attempts) or 'no batch arrived'}. "
        f"A trial needs its warm-up batches and then more within {HARD_CAP_S:g} s "
        f"({MIN_STEADY_BATCHES} to be believed). Check the batch size ({hint}), or make "
        "batches cheaper.",
        type="no_steady_state")


def _baseline_source(resolved: ResolvedTarget, request: RunRequest) -> str:
    if request.settings:
        return "your current settings"
    if resolved.dataloader_kwargs:
        return "the module's dataloader_kwargs"
    return "DataLoader's defaults (num_workers=0; the module declares no dataloader_kwargs)"


def _baseline(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
              outcome: TuneOutcome, on_trial: Callable[[TrialResult], None], source: str,
              companions: Companions | None = None) -> dict[str, Any]:
    """The baseline when the pick is the settings the run started from: measured (unless a
    search trial already measured exactly those settings), and no speedup claimed."""
    same = [t for t in outcome.trials if t.key == config.tuned_key and t.phase != "prewarm"]
    trial = same[0] if same else measure_trial(resolved, config, consumer, "baseline", 0,
                                               companions=companions)
    if trial is not None and not same:
        outcome.trials.append(trial)
        on_trial(trial)
    return {
        "source": source,
        "config": config.to_json_dict(),
        "samples_per_s": trial.samples_per_s if trial else None,
        "consumer_idle_frac": trial.consumer_idle_frac if trial else None,
        # two trials of one setting differ by noise only: no speedup to claim
        "speedup": 1.0, "speedup_pct": outcome.recommendation.uncertainty_pct,
        "speedup_note": "the recommendation is the settings you already have",
    }


def tune_document(outcome: TuneOutcome, baseline: dict[str, Any], config: LoaderConfig,
                  seconds: float, expressions: dict[str, str] | None = None) -> dict[str, Any]:
    rec = outcome.recommendation
    recommended = {k: v for k, v in rec.kwargs.items() if v is not None or k == "batch_size"}
    if config.batch_sampler is not None:  # the user's batch sampler makes the batches
        recommended.pop("batch_size", None)
    # The user's other settings (shuffle, sampler, collate_fn, ...) stay in the line.
    snippet = recommended_config(config, recommended).snippet(expressions=expressions)
    chosen = sorted((t for t in outcome.trials if t.num_workers == rec.kwargs["num_workers"]
                     and t.phase != "baseline"), key=lambda t: t.phase != "final")
    warnings = list(rec.warnings)
    base_rate = baseline.get("samples_per_s")
    if base_rate and rec.expected_samples_per_s and base_rate > 1.05 * rec.expected_samples_per_s:
        warnings.append(Diagnostic(
            "baseline_faster", "warning",
            f"The baseline ({baseline['source']}) measured {base_rate:.0f} samples/s, "
            f"more than the pick's {rec.expected_samples_per_s:.0f}. The machine's "
            "load may have shifted during tuning: verify before switching.",
            {"baseline_samples_per_s": base_rate,
             "pick_samples_per_s": rec.expected_samples_per_s}))
    return {
        "recommended": recommended,
        "snippet": snippet,
        "expected_samples_per_s": rec.expected_samples_per_s,
        "expected_consumer_idle_frac": chosen[0].consumer_idle_frac if chosen else None,
        "uncertainty_pct": rec.uncertainty_pct,
        "baseline": baseline,
        "trials": [t.to_dict() for t in outcome.trials],
        "reasons": list(rec.reasons),
        "warnings": [w.to_dict() for w in warnings],
        "profile": outcome.profile.to_dict() if outcome.profile else None,
        "limits": outcome.limits.__dict__,
        "tuning_seconds": seconds,
        "trial_seconds": sum(t.seconds for t in outcome.trials),
    }
