"""The end of the tune, in the engine's child: the pick measured with all its settings and in
and out of order, then the user's settings and the pick in turn for the claim (tune/claim.py
judges it), each pair in the tune's process or, every second one, in a second process.

NOTE [ A claim from two processes ]

    All of a tune's trials run in one process (the engine's child), a plain loop in another: a
    fresh interpreter with its own heap, imports, caches and page faults, started in another
    minute of the machine's. A claim whose pairs all come from one process knows its ratio
    only as well as that process holds it: on datasets written by others claims landed at
    0.68-1.29 of plain loops in fresh processes where their intervals said +-5-10%. So the
    claim's second pair (and fourth) is measured in a second process: a fresh interpreter
    loading the target as a plain loop would (child/companions.py), started when that pair is
    due, its load counted in the plan (the child's own start-up stands for it). Its ratio
    joins the pairs' spread (claim.ratio_parts), so the claim's interval holds the spread
    between processes, and a claim the two disagree on is not made: the figures of each
    process are shown side by side. Where no pair could be measured there (the time left, a
    tune's aim or the user's limit, had no room for it; it failed to load), no claim is made
    either, the reason saying why with the figures: one process cannot tell how far processes
    differ (audio features with a CPU step, one pair under the aim: 1.69x +-4% claimed, 1.35x
    in plain loops in fresh processes). With --local-world-size there is none (its trials would
    run without the other ranks' contention): the claim is the tune's process's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Callable

import psutil
import torch

from dataloader_tuner.child.companions import Companions, TrialOrder
from dataloader_tuner.child.target import ResolvedTarget
from dataloader_tuner.child.trial_run import PREWARM_S, TrialRunner, measure_trial
from dataloader_tuner.record.cards import Consumer
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.errors import RunError
from dataloader_tuner.protocol import RunRequest
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.settings import recommended_config
from dataloader_tuner.tune import claim, order, plan
from dataloader_tuner.tune.planner import epoch_batches
from dataloader_tuner.tune.tuner import TuneOutcome

SECOND_PROCESS = "The second process measuring the claim (a fresh interpreter)"


_warmed: list[bool] = []  # (in the second process) its untimed pass is done


def measure_alone(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
                  order: TrialOrder) -> TrialResult | None:
    """A claim's trial in the second process, as the tune's own are measured: its first after
    an untimed pass, as the tune's first probe (TrialRunner.first_batch_s: a fresh process's
    first batches pay for page faults, allocator growth and lazy imports)."""
    started, limit_s = time.monotonic(), order.limit_s
    if not _warmed:
        measure_trial(resolved, config, consumer, "prewarm", 0, window=PREWARM_S,
                      limit_s=limit_s)
        _warmed.append(True)
        if limit_s is not None:  # (the user's limit holds for both: none left, no trial)
            warmed_s = time.monotonic() - started
            if limit_s <= 2 * warmed_s:
                return None
            limit_s -= warmed_s
    return measure_trial(resolved, config, consumer, order.phase, order.repeat,
                         window=order.window, limit_s=limit_s, share_s=order.share_s)


def started_s() -> float:
    """How long this process took to get here since it began (the interpreter, torch, the
    user's module): what a second process's load is expected to take."""
    return max(time.time() - psutil.Process().create_time(), 0.0)


class SecondProcess:
    """NOTE [ A claim from two processes ]: a fresh interpreter for the claim's second pairs,
    started when first due where the time left fits its load, closed with the tune."""

    def __init__(self, request: RunRequest, runner: TrialRunner, load_s: float,
                 beat: Callable[[], None] | None = None) -> None:
        """``load_s``: what its load is expected to take (the child's own start-up)."""
        self.request, self.runner, self.load_s, self.beat = request, runner, load_s, beat
        self.companion: Companions | None = None
        self.failure: str | None = None  # why it could not measure, once it could not
        self.unmeasured: str | None = None  # why a pair due there was not measured there
        self.used = False  # a trial of the claim was measured there

    def ready(self, pair_s: float) -> bool:
        """Started (now, where not yet) if the time left fits its load and a pair."""
        if self.companion is not None:
            return True
        if self.failure is not None or not self.runner.time_limit.fits(self.load_s + pair_s):
            self.unmeasured = self.failure or "the time left had no room for its load"
            return False
        request = self.request
        try:
            self.companion = Companions(request.target, request.settings, request.step_ms, 1,
                                        who=SECOND_PROCESS, beat=self.beat,
                                        alone=measure_alone)
        except RunError as exc:
            self.failure = self.unmeasured = exc.message.splitlines()[0]
        return self.companion is not None

    def measuring(self, config: LoaderConfig, phase: str, share_s: float | None
                  ) -> Callable[[int], TrialResult | None]:
        """As TrialRunner.measuring, the trial measured there (None once it failed: a pair
        half from each process would compare the processes, not the settings)."""
        def measure(repeat: int) -> TrialResult | None:
            if self.companion is None:
                return None
            try:
                trial = self.runner.measure(config, phase, repeat, share_s=share_s,
                                            elsewhere=self.companion)
            except RunError as exc:
                self.failure = exc.message.splitlines()[0]  # (its traceback: not a reason)
                self.close()
                return None
            self.used = self.used or trial is not None
            return trial
        return measure

    def close(self) -> None:
        if self.companion is not None:
            self.companion.close()
            self.companion = None


def estimated_s(outcome: TuneOutcome, config: LoaderConfig) -> float:
    """One trial of ``config`` as the plan estimates it (0 when nothing tells)."""
    profile = outcome.profile
    if profile is None:
        return 0.0
    return plan.modelled_trial_seconds(profile, config.num_workers)


def measure_final(runner: TrialRunner, config: LoaderConfig, outcome: TuneOutcome
                   ) -> TuneOutcome:
    """Measure the recommendation with all its settings when the search did not (a deeper
    prefetch, workers restarted each epoch): the outcome, expecting what that measured."""
    rec = outcome.recommendation
    final = recommended_config(config, rec.kwargs)
    if not final.num_workers or any(t.key == final.tuned_key and t.phase != "baseline"
                                    for t in outcome.trials):
        return outcome  # the search measured exactly these settings
    if not runner.time_limit.fits(estimated_s(outcome, final)):
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


def delivery_order(runner: TrialRunner, final: LoaderConfig, outcome: TuneOutcome,
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
            2 * claim.CLAIM_PAIRS * estimated_s(outcome, final)):
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


def pairs_at_end(runner: TrialRunner, config: LoaderConfig, final: LoaderConfig,
                 outcome: TuneOutcome, epoch_items: int | None,
                 second: SecondProcess | None = None
                 ) -> tuple[list[TrialResult | None], list[TrialResult | None], claim.Claim]:
    """The user's settings and the pick in turn, CLAIM_PAIRS pairs, and more (up to
    MAX_CLAIM_PAIRS) while the claim is wider than CLAIM_WITHIN_PCT: each pair only where the
    user's time limit leaves room for it, every second one in ``second`` where it is ready
    (NOTE [ A claim from two processes ])."""
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
        where: TrialRunner | SecondProcess = runner
        if second is not None and len(pick_trials) % 2 == 1:
            if not second.ready(pair_s):
                break  # (another pair here could not make a claim: claim.one_process)
            where = second
        # under the aim, each trial of the pair its half of what is left
        half = None if time_limit.aim_s is None else (time_limit.aim_left() or 0.0) / 2
        more_base, more_pick = claim.alternate(where.measuring(config, "baseline", half),
                                               where.measuring(final, "final", half), pairs=1,
                                               first=len(pick_trials))
        base_trials += more_base
        pick_trials += more_pick
        result = claim.end_claim(base_trials, pick_trials, epoch_items)
    return base_trials, pick_trials, result


def claim_at_end(runner: TrialRunner, config: LoaderConfig, final: LoaderConfig,
                 outcome: TuneOutcome, source: str, epoch_items: int | None,
                 second: SecondProcess | None = None) -> tuple[TuneOutcome, dict[str, Any]]:
    """The user's settings and the pick measured in turn at the end of the tune; the claim and
    the pick's expected rate come from those trials only (NOTE [ Claims from the end of the
    tune ])."""
    base_trials, pick_trials, result = pairs_at_end(runner, config, final, outcome,
                                                    epoch_items, second)
    # NOTE [ A claim from two processes ]
    if second is not None and second.failure is not None:
        result = claim.Claim(None, None, "no speedup is claimed: "
                             + second.failure[:1].lower() + second.failure[1:],
                             result.base, result.pick, result.ratio)
    elif second is not None and not second.used:
        result = claim.one_process(result, second.unmeasured
                                   or "the time left had room for one pair: a longer "
                                   "--budget-s measures a second")
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


def own_baseline(runner: TrialRunner, config: LoaderConfig, outcome: TuneOutcome, source: str
              ) -> dict[str, Any]:
    """The baseline when the pick is the settings the run started from: measured (unless a
    search trial already measured exactly those settings), and no speedup claimed."""
    same = [t for t in outcome.trials if t.key == config.tuned_key and t.phase != "prewarm"]
    trial = same[0] if same else (
        runner.measure(config, "baseline")
        if runner.time_limit.fits(estimated_s(outcome, config)) else None)
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


