"""Tuning in the engine's child process: real trials for the search in tune/tuner.py.

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
from dataclasses import replace
from typing import Any, Callable


from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.errors import RunError
from dataloader_tuner.tune import claim, plan
from dataloader_tuner.child import claiming
from dataloader_tuner.child.companions import Companions
from dataloader_tuner.record.cards import Consumer, dataset_length
from dataloader_tuner.analyse.ceiling import (BatchCost, cached_prediction, measured_row,
                                              threaded_prediction, threads_change, threads_for)
from dataloader_tuner.analyse.fixes import ceiling_fields
from dataloader_tuner.child.cached import GATHER_S, measure_cached
from dataloader_tuner.child.io_threads import measure_threaded
from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.protocol import RunRequest
from dataloader_tuner.system import SystemSnapshot
from dataloader_tuner.tune import costmodel
from dataloader_tuner.tune.recommend import Limits, uncertainty_pct
from dataloader_tuner.child.starting import snippet_names
from dataloader_tuner.settings import recommended_config
from dataloader_tuner.child.target import ResolvedTarget
from dataloader_tuner.record.trials import TrialResult, TunePlan
from dataloader_tuner.child.trial_run import TrialRunner
from dataloader_tuner.tune.trial_rules import HARD_CAP_S, MIN_STEADY_BATCHES
from dataloader_tuner.tune.heap_check import HeapDecision
from dataloader_tuner.tune.same_settings import same_settings
from dataloader_tuner.tune.side_check import carried
from dataloader_tuner.tune.time_limit import TimeLimit
from dataloader_tuner.tune.thread_pools import ThreadsDecision
from dataloader_tuner.tune.tuner import NoSteadyState, Tuner, TrialSpec, TuneOutcome
from dataloader_tuner.tune.planner import Planner


def run_tune(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
             system: SystemSnapshot, request: RunRequest,
             on_trial: Callable[[TrialResult], None],
             on_plan: Callable[[TunePlan], None] = lambda plan: None,
             on_batches: Callable[[], None] | None = None) -> dict[str, Any]:
    """Search, then measure the module's own settings as the baseline; returns the document.
    ``on_plan``: the plan, as soon as it is known and again after the probes."""
    limits = Limits.from_system(system, request.local_world_size, request.max_workers,
                                dataset_length(resolved.dataset))
    search_config = config.replace(num_workers=0, pin_memory=False, prefetch_factor=None,
                                   persistent_workers=False)
    time_limit = TimeLimit(request.budget_s)
    runner = TrialRunner(resolved, consumer, on_trial, time_limit, on_batches)
    has_consumer = consumer.kind != "none"
    heap_decision = HeapDecision()
    # threads against the cores this rank has (a quota counted), not less the load now
    threads_decision = ThreadsDecision(cpus_usable=system.cores / limits.local_world_size)
    # NOTE [ A claim from two processes ] (claiming.py): not beside a node's companions, whose
    # contention a trial measured alone would leave out
    second = (claiming.SecondProcess(request, runner, claiming.started_s(), on_batches)
              if request.local_world_size == 1 else None)
    planner = Planner(config, limits, has_consumer, time_limit, on_plan,
                      fresh_check=heap_decision.available,
                      threads_pending=lambda: not threads_decision.decided,
                      second_process_s=second.load_s if second is not None else 0.0)
    threads_of: dict[int, int | None] = {}  # a worker count stays on its first trial's setting
    seen: set[int] = set()  # the counts measured: under a limit, those left share it

    def share_s(workers: int) -> float | None:
        must = {n for n in (0, 1, planner.predicted or 0) if n <= limits.max_workers}
        return time_limit.share(len((must - seen) | {workers}))

    def measure(spec: TrialSpec) -> TrialResult | None:
        # NOTE [ Persistent workers while searching ]: the restart cost is judged apart.
        trial_config = search_config.replace(
            num_workers=spec.num_workers, persistent_workers=spec.num_workers > 0,
            worker_threads=threads_of.get(spec.num_workers, threads_decision.worker_threads)
            if spec.num_workers else None,
            keep_freed_memory=heap_decision.first_keeps and spec.num_workers > 0)
        trial = runner.measure(trial_config, spec.phase, spec.repeat, report=False, search=True,
                               share_s=share_s(spec.num_workers))
        if trial is None:
            return None
        seen.add(spec.num_workers)
        # NOTE [ Deciding threads during the search ] (tune/thread_pools.py)
        trial = threads_decision.check(
            trial, lambda threads, repeat: runner.measure(
                trial_config.replace(worker_threads=threads), spec.phase, repeat, report=False),
            on_trial)
        threads_of.setdefault(spec.num_workers, trial.worker_threads)
        # NOTE [ Deciding freed memory during the search ] (tune/heap_check.py)
        # (under the aim, measured as a count the tune must see: the pick's rate in the
        # job depends on it; under a user's limit, only where it leaves room)
        return heap_decision.check(
            trial, lambda: runner.measure(
                trial_config.replace(keep_freed_memory=False, multiprocessing_context="spawn",
                                     worker_threads=trial.worker_threads),
                spec.phase, 1, report=False, share_s=share_s(spec.num_workers),
                most_steady=plan.FAULT_BATCHES),
            on_trial, time_limit.budget_left())

    first_batch_s = runner.first_batch_s(search_config)
    if first_batch_s is not None:
        planner.first(first_batch_s)
    # A node of N ranks: every trial runs N loaders at once (companions.py).
    companions = runner.companions = (
        Companions(request.target, request.settings, request.step_ms,
                   request.local_world_size - 1) if request.local_world_size > 1 else None)
    try:
        tuner = Tuner(measure, limits, system, has_consumer=has_consumer,
                      step_on_cpu=consumer.kind == "train_step", time_limit=time_limit,
                      batch_size=config.batch_size, on_trial=on_trial,
                      on_plan=lambda profile, predicted, counts: planner.after_probes(
                          profile, predicted, counts, tuner.trials))
        try:
            outcome = tuner.run()
        except NoSteadyState as exc:
            raise no_steady_state_error(runner.attempts, config) from exc
        pick = [t for t in outcome.trials if t.num_workers == outcome.recommendation.kwargs[
            "num_workers"] and t.phase not in claim.OUTSIDE_SEARCH]
        checks = (threads_decision, heap_decision)
        outcome = replace(outcome, trials=[*outcome.trials,
                                           *(t for check in checks for t in check.others)],
                          recommendation=carried(checks, outcome.recommendation, pick))
        source = _baseline_source(resolved, request)
        final = recommended_config(config, outcome.recommendation.kwargs)
        final, outcome = claiming.delivery_order(runner, final, outcome, request.keep_order)
        if same_settings(final, config):
            outcome = claiming.measure_final(runner, config, outcome)
            baseline = claiming.own_baseline(runner, config, outcome, source)
        else:
            outcome, baseline = claiming.claim_at_end(runner, config, final, outcome, source,
                                                      limits.dataset_length, second)
    finally:
        if second is not None:
            second.close()
        if companions is not None:
            companions.close()
    document = tune_document(outcome, baseline, config, time_limit.spent(),
                             snippet_names(resolved, config))
    stacks = runner.stacks.merged()
    cached = (measure_cached(runner, final) if runner.time_limit.fits(
        GATHER_S + claiming.estimated_s(outcome, final)) else None)
    cost = tune_cost(outcome)
    threads = threads_for(cost, final.batch_size) if cost is not None else None
    threaded = (measure_threaded(runner, final, threads) if threads and runner.time_limit.fits(
        plan.IO_THREAD_TRIALS * claiming.estimated_s(outcome, final)) else None)
    return {**document, "plan": planner.to_dict(), "stacks": stacks,
            **tune_ceiling(outcome, cost, stacks, final.num_workers, cached,
                           (threads, threaded) if threads and threaded else None),
            "tuning_seconds": time_limit.spent()}  # (the checks after the claim included)


def tune_cost(outcome: TuneOutcome) -> BatchCost | None:
    """A batch's cost as the tune's cost model learnt it (None where it learnt none)."""
    profile, serial = outcome.profile, [t for t in outcome.trials if t.num_workers == 0]
    if profile is None or not serial:
        return None
    cap = outcome.limits.memory_max_workers or outcome.limits.max_workers
    profile = costmodel.at_busy_cores(profile, outcome.trials, outcome.limits.other_load_cpus,
                                      outcome.limits.local_world_size)
    return profile.cost_from(serial[0], min(cap, outcome.limits.max_workers))


def tune_ceiling(outcome: TuneOutcome, cost: BatchCost | None, stacks: dict[str, Any] | None,
                 workers: int,
                 cached: tuple[list[TrialResult], int] | None,
                 threaded: tuple[int, list[TrialResult]] | None = None) -> dict[str, Any]:
    """The most this machine can make for this dataset, against the pick's rate, and what
    would raise it (analyse/ceiling.py), where the cost model was learnt (``cost``:
    tune_cost's, None where it learnt none); ``cached``: the
    pick (``workers``) measured over samples held in RAM (child/cached.py), and how many;
    ``threaded``: the pick measured with threads fetching (child/io_threads.py), how many."""
    if cost is None:
        return {}
    measured = outcome.recommendation.expected_samples_per_s
    first = []
    if cached is not None:  # measured: first among the changes, beside its prediction
        trials, held = cached
        first.append(measured_row(f"every sample cached in RAM (measured over {held} held)",
                                  cached_prediction(cost, stacks, workers),
                                  statistics.fmean(t.samples_per_s for t in trials),
                                  uncertainty_pct(trials), measured,
                                  "a cache helps only where a sample is the same every epoch"))
    if threaded is not None:
        count, trials = threaded
        first.append(measured_row(threads_change(count, workers),
                                  threaded_prediction(cost, workers, count),
                                  statistics.fmean(t.samples_per_s for t in trials),
                                  uncertainty_pct(trials), measured,
                                  "where your dataset can be read from several threads"))
    return ceiling_fields(cost, stacks, measured,
                          [w.code for w in outcome.recommendation.warnings],
                          outcome.limits.gpu_available, first)


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
