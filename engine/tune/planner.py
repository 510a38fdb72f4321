"""The tune's plan as the child announces it: a first from the prewarm's batch, a second once
the probes taught the cost model, each keeping the at most the first promised (tune/plan.py
estimates; NOTE [ A budget in batches ], NOTE [ An at most that holds ])."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.record.trials import TrialResult, TunePlan
from dataloader_tuner.tune import plan
from dataloader_tuner.tune.time_limit import TimeLimit
from dataloader_tuner.tune.costmodel import CostProfile
from dataloader_tuner.analyse.ceiling import threads_for
from dataloader_tuner.tune.recommend import Limits, by_workers, median_rate
from dataloader_tuner.tune.trial_rules import MIN_STEADY_BATCHES
from dataloader_tuner.tune.tuner import close_leaders, floor_count


class Planner:
    """The tune's plan, said before it is spent (NOTE [ A budget in batches ], plan.py): a
    first one from the prewarm's batch, a second once the probes have taught the model."""

    def __init__(self, config: LoaderConfig, limits: Limits, has_consumer: bool,
                 time_limit: TimeLimit, on_plan: Callable[[TunePlan], None],
                 fresh_check: bool = False,
                 threads_pending: Callable[[], bool] = lambda: True,
                 second_process_s: float = 0.0) -> None:
        """``fresh_check``: the first trial with workers is measured again in fresh workers
        (NOTE [ Deciding freed memory during the search ]), one short trial at 1 worker;
        ``threads_pending()``: the threads decision may still run its trials (thread_pools.py);
        ``second_process_s``: the load of the claim's second process (plan.claim_seconds)."""
        self.limits, self.has_consumer, self.fresh_check = limits, has_consumer, fresh_check
        self.second_process_s = second_process_s
        self.threads_pending = threads_pending
        self.time_limit, self.on_plan = time_limit, on_plan
        self.base = plan.Baseline(config.num_workers, config.persistent_workers,
                                  epoch_batches(config, limits.dataset_length))
        self.batch_size = config.batch_size
        self.plans: list[TunePlan] = []
        self.predicted: int | None = None  # the count the plan expects to pick, as last said

    def first(self, serial_batch_s: float) -> None:
        cores = self.limits.cpu_budget
        predicted, counts = plan.first_counts(cores, self.limits.max_workers)
        floor = floor_count(counts[-1], self.limits.max_workers)
        if self.has_consumer and floor > counts[-1]:
            counts.append(floor)
        spawned = int(self.fresh_check and self.limits.max_workers >= 1)
        batch_s = plan.guessed_batch_s(serial_batch_s, cores)
        # NOTE [ Said after the probes ] (plan.py)
        probes_s = plan.probes_seconds(batch_s, spawned) if self.limits.max_workers else None
        self._announce(batch_s, serial_batch_s, counts, predicted, 0, known=False,
                       spawned=spawned, steady_with_workers=plan.WORKER_STEADY_GUESS,
                       probes_s=probes_s if probes_s and probes_s <= plan.PROBES_FIRST_S
                       else None)

    def after_probes(self, profile: CostProfile, predicted: int, counts: list[int],
                     trials: list[TrialResult]) -> None:
        """The plan from the cost model, with what the probes already tell: whether the search
        ends at them (then its confirm step only where they are close), whether the pick will
        be measured with threads fetching (child/io_threads.py), and whether the end's claim is
        to come (not where the model has the user's own count at least as fast as the one it
        predicts: audio_like's step fed at 2 workers, its own 0 twice as fast, and the search
        kept 0; said ~35 s, took 18.5 s)."""
        confirms = plan.CONFIRM_TRIALS
        if not counts and not self.has_consumer:  # the confirm step compares the probes alone
            rates = {n: median_rate(group) for n, group in by_workers(trials).items()}
            confirms = len(close_leaders(rates))
        serial = [t for t in trials if t.num_workers == 0]
        fetching = bool(serial) and threads_for(
            profile.cost_from(serial[0], self.limits.max_workers), self.batch_size) is not None
        self._announce(plan.modelled_batch_s(profile), profile.serial_ms / 1000.0, counts,
                       predicted, len(trials), known=True,
                       steady=plan.steady_to_tell(t for t in trials if t.phase == "probe"),
                       confirms=confirms, threads_fetching=fetching)

    def _announce(self, batch_s: Callable[[int], float], serial_batch_s: float,
                  counts: list[int], predicted: int, measured: int, known: bool,
                  spawned: int = 0, steady: float = MIN_STEADY_BATCHES,
                  steady_with_workers: float | None = None, probes_s: float | None = None,
                  confirms: int = plan.CONFIRM_TRIALS, threads_fetching: bool = False) -> None:
        """The plan made, its at most kept from here (NOTE [ An at most that holds ]), and
        said; ``probes_s``: the probes' time, said instead of the tune's (NOTE [ Said after
        the probes ])."""
        self.predicted = predicted
        made = plan.plan_tune(batch_s, serial_batch_s, self.limits.cpu_budget, counts, predicted,
                              self.base, self.time_limit.spent(), measured,
                              self.time_limit.budget_s, known, spawned,
                              self.limits.max_workers, steady, self.threads_pending(),
                              steady_with_workers, confirms, threads_fetching,
                              self.second_process_s)
        made = self._aimed(made, batch_s, serial_batch_s, predicted, spawned)
        at_most = self.time_limit.promise(made.at_most_s or made.estimated_s, serial_batch_s)
        made = replace(made, at_most_s=at_most)  # (an estimate past it: "cut short" said)
        # (a plan a limit cuts short is said at once: what it will not reach)
        if probes_s is not None and made.aim_s is None and not made.cut_short:
            made = replace(made, estimated_s=made.spent_s + probes_s, probing=True)
        self.plans.append(made)
        self.on_plan(made)

    def _aimed(self, made: TunePlan, batch_s: Callable[[int], float], serial_batch_s: float,
               predicted: int, spawned: int) -> TunePlan:
        """NOTE [ A tune's aim ]: without a user's limit, the aim (never lowered once said) and
        the time kept for the claim's pair; the plan says the aim where it ends first.
        ``spawned``: the freed-memory check's trial is still to come (1 worker, fresh)."""
        if self.time_limit.budget_s is not None:
            return made
        reserve = (plan.claim_seconds(batch_s, predicted, self.base, serial_batch_s,
                                      self.limits.cpu_budget, pairs=1,
                                      trial=plan.settled_trial_seconds)
                   if predicted != self.base.num_workers else 0.0)
        # each count it must see for the batches a rate needs, whatever the spread said
        least = plan.floor_seconds(batch_s, predicted, self.base, self.limits.max_workers) \
            + spawned * plan.fresh_check_seconds(batch_s(1))
        aim = max(plan.AIM_S, least + reserve, self.time_limit.aim_s or 0.0)
        self.time_limit.aim(aim, reserve)
        if made.estimated_s <= aim:
            return made
        at_most = min(made.at_most_s or math.inf, plan.AIM_AT_MOST * aim)
        return replace(made, estimated_s=aim, aim_s=aim, whole_plan_s=made.estimated_s,
                       at_most_s=at_most)

    def to_dict(self) -> dict[str, Any] | None:
        """The plans as the document keeps them: the first announced, the last made."""
        # (the tune's time as said after the probes, where it waited for them)
        said = [made for made in self.plans if not made.probing] or self.plans
        if not said:
            return None
        return {**said[-1].to_dict(), "announced_s": said[0].estimated_s,
                "announced_at_most_s": self.plans[0].at_most_s, "text": said[-1].text()}


def epoch_batches(config: LoaderConfig, items: int | None) -> int | None:
    """Batches in an epoch of ``items`` (whole batches with batch_size=None)."""
    if not items or config.batch_sampler is not None:
        return None
    if config.batch_size is None:
        return items
    return (items // config.batch_size if config.drop_last
            else math.ceil(items / config.batch_size)) or None
