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

import torch

from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.errors import RunError
from dataloader_tuner.tune import claim, order, plan
from dataloader_tuner.child.companions import Companions
from dataloader_tuner.child.dataset_card import dataset_length
from dataloader_tuner.record.cards import Consumer
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
from dataloader_tuner.tune.trials import HARD_CAP_S, MIN_STEADY_BATCHES
from dataloader_tuner.tune.heap_check import HeapDecision
from dataloader_tuner.tune.thread_pools import ThreadsDecision
from dataloader_tuner.tune.tuner import NoSteadyState, Tuner, TrialSpec, TuneOutcome
from dataloader_tuner.tune.planner import Planner, epoch_batches


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
    time_limit = plan.TimeLimit(request.budget_s)
    runner = TrialRunner(resolved, consumer, on_trial, time_limit, on_batches)
    has_consumer = consumer.kind != "none"
    heap_decision = HeapDecision()
    # threads against the cores this rank has (a quota counted), not less the load now
    threads_decision = ThreadsDecision(system.cores / limits.local_world_size)
    planner = Planner(config, limits, has_consumer, time_limit, on_plan,
                      fresh_check=heap_decision.available,
                      threads_pending=lambda: not threads_decision.decided)
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
        outcome = replace(outcome, trials=[*outcome.trials, *threads_decision.others,
                                           *heap_decision.others],
                          recommendation=heap_decision.recommend(
                              threads_decision.recommend(outcome.recommendation, pick), pick))
        source = _baseline_source(resolved, request)
        final = recommended_config(config, outcome.recommendation.kwargs)
        final, outcome = _delivery_order(runner, final, outcome, request.keep_order)
        if claim.same_settings(final, config):
            outcome = _measure_final(runner, config, outcome)
            baseline = _baseline(runner, config, outcome, source)
        else:
            outcome, baseline = _claim_at_end(runner, config, final, outcome, source,
                                              limits.dataset_length)
    finally:
        if companions is not None:
            companions.close()
    document = tune_document(outcome, baseline, config, time_limit.spent(),
                             snippet_names(resolved, config))
    stacks = runner.stacks.summary()
    cached = (measure_cached(runner, final) if runner.time_limit.fits(
        GATHER_S + _estimated_s(outcome, final)) else None)
    cost = tune_cost(outcome)
    threads = threads_for(cost, final.batch_size) if cost is not None else None
    threaded = (measure_threaded(runner, final, threads) if threads and runner.time_limit.fits(
        plan.IO_THREAD_TRIALS * _estimated_s(outcome, final)) else None)
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


def _estimated_s(outcome: TuneOutcome, config: LoaderConfig) -> float:
    """One trial of ``config`` as the plan estimates it (0 when nothing tells)."""
    profile = outcome.profile
    if profile is None:
        return 0.0
    return plan.modelled_trial_seconds(profile, config.num_workers)


def _measure_final(runner: TrialRunner, config: LoaderConfig, outcome: TuneOutcome
                   ) -> TuneOutcome:
    """Measure the recommendation with all its settings when the search did not (a deeper
    prefetch, workers restarted each epoch): the outcome, expecting what that measured."""
    rec = outcome.recommendation
    final = recommended_config(config, rec.kwargs)
    if not final.num_workers or any(t.key == final.tuned_key and t.phase != "baseline"
                                    for t in outcome.trials):
        return outcome  # the search measured exactly these settings
    if not runner.time_limit.fits(_estimated_s(outcome, final)):
        return outcome
    trial = runner.measure(final, "final")
    if trial is None:
        return outcome
    remeasured = replace(
        rec, expected_samples_per_s=trial.samples_per_s,
        uncertainty_pct=100.0 * trial.rate_ci if trial.rate_ci is not None else None,
        conclusive=trial.conclusive,
        reasons=rec.reasons + (f"Measured again with all the recommended settings: "
                               f"{trial.samples_per_s:.0f} samples/s; that is the figure "
                               "expected.",))
    return replace(outcome, trials=[*outcome.trials, trial], recommendation=remeasured)


def _delivery_order(runner: TrialRunner, final: LoaderConfig, outcome: TuneOutcome,
                    keep_order: bool) -> tuple[LoaderConfig, TuneOutcome]:
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
    if try_it and not runner.time_limit.fits(
            2 * claim.CLAIM_PAIRS * _estimated_s(outcome, final)):
        try_it, why_not = False, ("in_order=False was not tried: your time limit left no "
                                  "room to measure it.")
    if not try_it:
        if why_not:
            outcome = replace(outcome, recommendation=replace(rec, reasons=(*rec.reasons,
                                                                             why_not)))
        return final, outcome
    unordered_config = final.replace(in_order=False)
    ordered, unordered = claim.alternate(runner.measuring(final, "in_order"),
                                         runner.measuring(unordered_config, "out_of_order"))
    chosen, reason = order.decide(ordered, unordered)
    kwargs = {**rec.kwargs, "in_order": False} if chosen else rec.kwargs
    rec = replace(rec, kwargs=kwargs, reasons=(*rec.reasons, reason))
    trials = [*outcome.trials, *(t for t in ordered + unordered if t is not None)]
    return (unordered_config if chosen else final), replace(outcome, trials=trials,
                                                            recommendation=rec)


def _pairs_at_end(runner: TrialRunner, config: LoaderConfig, final: LoaderConfig,
                  outcome: TuneOutcome, epoch_items: int | None
                  ) -> tuple[list[TrialResult | None], list[TrialResult | None], claim.Claim]:
    """The user's settings and the pick in turn, CLAIM_PAIRS pairs, and more (up to
    MAX_CLAIM_PAIRS) while the claim is wider than CLAIM_WITHIN_PCT: each pair only where the
    user's time limit leaves room for it."""
    profile = outcome.profile
    pair_s = 0.0
    if profile is not None:
        base = plan.Baseline(config.num_workers, config.persistent_workers,
                             epoch_batches(config, epoch_items))
        pair_s = plan.claim_seconds(plan.modelled_batch_s(profile), final.num_workers, base,
                                    profile.serial_ms / 1000.0, outcome.limits.cpu_budget,
                                    pairs=1)
    time_limit = runner.time_limit
    time_limit.claiming()  # NOTE [ A tune's aim ] (plan.py): the time kept for it
    base_trials: list[TrialResult | None] = []
    pick_trials: list[TrialResult | None] = []
    result = claim.end_claim(base_trials, pick_trials, epoch_items)
    while len(pick_trials) < claim.MAX_CLAIM_PAIRS:
        if len(pick_trials) >= claim.CLAIM_PAIRS and not result.too_wide:
            break
        # too wide: more only where they could narrow it (NOTE [ Pairs that cannot narrow a
        # claim ]); a too-wide claim had every trial measured
        if len(pick_trials) >= claim.CLAIM_PAIRS and not claim.can_narrow(
                result.base.trials if result.base else [],
                result.pick.trials if result.pick else [], epoch_items):
            break
        if not time_limit.fits(pair_s, must=not pick_trials):
            break
        # under the aim, each trial of the pair its half of what is left
        half = None if time_limit.aim_s is None else (time_limit.aim_left() or 0.0) / 2
        more_base, more_pick = claim.alternate(runner.measuring(config, "baseline", half),
                                               runner.measuring(final, "final", half), pairs=1,
                                               first=len(pick_trials))
        base_trials += more_base
        pick_trials += more_pick
        result = claim.end_claim(base_trials, pick_trials, epoch_items)
    return base_trials, pick_trials, result


def _claim_at_end(runner: TrialRunner, config: LoaderConfig, final: LoaderConfig,
                  outcome: TuneOutcome, source: str, epoch_items: int | None
                  ) -> tuple[TuneOutcome, dict[str, Any]]:
    """The user's settings and the pick measured in turn at the end of the tune; the claim and
    the pick's expected rate come from those trials only (NOTE [ Claims from the end of the
    tune ])."""
    base_trials, pick_trials, result = _pairs_at_end(runner, config, final, outcome,
                                                     epoch_items)
    rec, early = outcome.recommendation, outcome.trials
    warnings = list(rec.warnings)
    reasons = list(rec.reasons)
    if result.pick is not None and result.base is not None:
        drifts = []
        for who, late, trial_config in (("The pick", result.pick, final),
                                        (f"Your settings ({source})", result.base, config)):
            found = claim.drifted(claim.comparable(early, trial_config), late)
            if found is not None:
                warnings.append(claim.drift_warning(found, who))
            drifts.append(found)
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
        else:  # NOTE [ A side that slowed while tuning ] (claim.py)
            result = claim.slowed(result, *drifts)
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
        if config.keep_freed_memory:
            kwargs["keep_freed_memory"] = True
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


def _baseline(runner: TrialRunner, config: LoaderConfig, outcome: TuneOutcome, source: str
              ) -> dict[str, Any]:
    """The baseline when the pick is the settings the run started from: measured (unless a
    search trial already measured exactly those settings), and no speedup claimed."""
    same = [t for t in outcome.trials if t.key == config.tuned_key and t.phase != "prewarm"]
    trial = same[0] if same else (
        runner.measure(config, "baseline")
        if runner.time_limit.fits(_estimated_s(outcome, config)) else None)
    if trial is not None and not same:
        outcome.trials.append(trial)
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
