"""The search: few, short, steady-state trials guided by the cost model, then a noise check.

1. Probe: measure ``num_workers=0`` and ``1``; learn the cost profile (costmodel.py).
2. Predict: the fewest workers that reach the peak (or, with a consumer, that keep it fed),
   and announce the plan: the trials left and their time (NOTE [ A budget in batches ]).
3. Climb: measure the prediction first, then step up while more workers still pay (>= 3% more
   samples/s, or 2 points less consumer idle) and down while fewer lose nothing (within the
   4% a trial's rate is known to).
   Like tf.data's AUTOTUNE hill-climb, but starting where the model says the peak is, so a
   latency-bound dataset jumps straight to many workers and a tiny one stays at zero.
4. With a consumer, measure one high worker count too (the floor): "fed" means idle within
   2 points of the least idle any setting reaches. A step that itself works the CPU is judged
   by the training loop's samples/s instead (NOTE [ A step on the CPU ]): no floor.
5. Confirm: re-measure the candidates noise could swap, interleaved (A B A B): the two fastest,
   or with a consumer the count where "fed" begins and the one below it. Decisions use the
   medians; the spread of the repeats is reported as the answer's uncertainty.

The search is pure: it calls ``measure(spec)`` and gets a ``TrialResult`` back, so tests drive
it with simulated workloads and no processes.

NOTE [ A step on the CPU ]

    With a consumer the search minimises the step's idle share: with a GPU step more workers
    cannot slow the step, so "fed" is where idle stops falling. A step that runs on the CPU
    (a model trained on it) shares the cores with the workers: extra workers stretch it, its
    idle share falls while the whole loop gets slower. Measured on tests/real/cpu_mlp.py (an
    MLP step, 2 CPUs): 2 workers 584 samples/s at 26% idle, 4 workers 545 at 5%; the idle
    rule picked 4. So where the 1-worker probe's main process spends at least
    STEP_CPU_SHARE of the step's time on the CPU, the climb, the confirmation and the pick go
    by the loop's samples/s, as a plain training loop is judged: cpu_mlp then picked 2
    persistent workers in 3 tunes of 3, the best of a plain grid of training loops (602
    samples/s; 4p 568, 8p 505).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from dataloader_tuner.tune import costmodel, plan
from dataloader_tuner.tune.costmodel import CostProfile
from dataloader_tuner.tune.recommend import (FEWER_WORKERS_TOLERANCE, Limits, Recommendation,
                                             by_workers, median_idle, median_rate, pick_fed,
                                             recommend)
from dataloader_tuner.system import SystemSnapshot
from dataloader_tuner.tune.time_limit import TimeLimit
from dataloader_tuner.tune.trial_rules import MIN_STEADY_BATCHES
from dataloader_tuner.record.trials import TrialResult

STEP_CPU_SHARE = 0.5

MORE_WORKERS_GAIN = 0.03
LESS_IDLE_GAIN = 0.02
KEEP_FEWER_SHARE = 1 - FEWER_WORKERS_TOLERANCE  # the climb steps down on the pick's own rule
CONFIRM_WITHIN = 0.10  # candidates within 10% of the best are re-measured
FLOOR_MIN_WORKERS = 8  # with a consumer, the idle floor is checked at least this high
MEMORY_SHARE = 0.5  # workers may use at most half the free RAM and half of /dev/shm


class NoSteadyState(Exception):
    """No trial measured a steady-state rate."""


@dataclass(frozen=True)
class TrialSpec:
    num_workers: int
    phase: str = "search"
    repeat: int = 0


@dataclass
class TuneOutcome:
    trials: list[TrialResult]
    profile: CostProfile | None
    recommendation: Recommendation
    limits: Limits
    stopped_by_budget: bool = False
    notes: list[str] = field(default_factory=list)


def grow(n: int) -> int:
    return n + 1 if n < 4 else math.ceil(n * 1.5)


def shrink(n: int) -> int:
    return n - 1 if n <= 4 else math.floor(n / 1.5)


def memory_max_workers(one_worker: TrialResult, system: SystemSnapshot,
                       prefetch: int = 2, ranks: int = 1) -> int | None:
    """Workers that fit: private memory each plus batches in flight, against free RAM and shm,
    which the node's ``ranks`` loaders share."""
    batch_mb = (one_worker.batch_bytes or 0) / 2**20
    per_worker = ((one_worker.worker_private_mb or 0) + prefetch * batch_mb) * max(ranks, 1)
    caps = []
    if per_worker > 0 and system.ram_available_mb:
        caps.append(int(MEMORY_SHARE * system.ram_available_mb / per_worker))
    shm = system.shm or {}
    if batch_mb > 0 and shm.get("free_mb") is not None:  # 0 free: no worker fits
        caps.append(int(MEMORY_SHARE * shm["free_mb"] / (max(ranks, 1) * prefetch * batch_mb)))
    return max(min(caps), 0) if caps else None  # 0: no worker's batches fit


class Tuner:
    def __init__(
        self,
        measure: Callable[[TrialSpec], TrialResult | None],
        limits: Limits,
        system: SystemSnapshot,
        has_consumer: bool,
        step_on_cpu: bool,
        time_limit: TimeLimit,
        batch_size: int | None,
        on_trial: Callable[[TrialResult], None] = lambda trial: None,
        on_plan: Callable[[CostProfile, int, list[int]], None] = lambda *plan: None,
    ) -> None:
        """``on_plan(profile, predicted, counts)``: once the probes have measured, the count
        the model predicts and the search's counts still to measure (plan.py)."""
        self.measure_fn, self.limits, self.system = measure, limits, system
        self.has_consumer, self.step_on_cpu = has_consumer, step_on_cpu
        self.time_limit, self.batch_size = time_limit, batch_size
        self.on_trial, self.on_plan = on_trial, on_plan
        self.trials: list[TrialResult] = []
        self.profile: CostProfile | None = None
        self.predicted: int | None = None  # the count the model points to, once probed
        self.max_n = limits.max_workers
        self.by_rate = not has_consumer  # NOTE [ A step on the CPU ]: decided by the probes

    @property
    def out_of_budget(self) -> bool:
        return self.time_limit.reached

    # -- measuring ------------------------------------------------------------------------

    def _measure(self, n: int, phase: str = "search", repeat: int = 0) -> list[TrialResult]:
        """Measure ``n`` workers unless already measured; returns all its trials."""
        done = [t for t in self.trials if t.num_workers == n]
        if done and phase != "confirm":
            return done
        # The first trial always starts (cut at the limit): without it there is nothing. The
        # counts the tune must see start past its aim (NOTE [ A tune's aim ], plan.py).
        must = phase != "confirm" and n in (0, 1, self.predicted)
        if self.trials and not self.time_limit.fits(self._trial_seconds(n), must=must) \
                and not (must and self._fits_cut(n)):
            return done
        trial = self.measure_fn(TrialSpec(n, phase, repeat))
        if trial is not None:
            self.trials.append(trial)
            self.on_trial(trial)
        return [t for t in self.trials if t.num_workers == n]

    def _trial_seconds(self, n: int, steady: float = MIN_STEADY_BATCHES) -> float:
        """A trial of ``n`` workers as the plan estimates it (plan.py), ``steady`` batches."""
        if self.profile is not None:
            return plan.modelled_trial_seconds(self.profile, n, steady)
        serial = [t for t in self.trials if t.num_workers == 0]
        if not serial:
            return 0.0
        guess = plan.guessed_batch_s(serial[0].ms_per_batch / 1000.0, self.limits.cpu_budget)
        return plan.trial_seconds(guess(n), n, steady=steady)

    def _fits_cut(self, n: int) -> bool:
        """NOTE [ A count cut at the user's limit ] (time_limit.py): a count the tune must see
        starts where its shortest believable trial fits in what the limit leaves."""
        return (self.time_limit.budget_s is not None
                and self.time_limit.fits(self._trial_seconds(n, plan.CUT_STEADY), must=True))

    def _score(self, n: int) -> float | None:
        trials = [t for t in self.trials if t.num_workers == n]
        if not trials:
            return None
        if not self.by_rate:
            idle = median_idle(trials)
            return -idle if idle is not None else None
        return median_rate(trials)

    def _better(self, new: float, old: float) -> bool:
        if not self.by_rate:
            return new > old + LESS_IDLE_GAIN
        return new > old * (1 + MORE_WORKERS_GAIN)

    def _no_worse(self, new: float, old: float) -> bool:
        if not self.by_rate:
            return new >= old - LESS_IDLE_GAIN
        return new >= old * KEEP_FEWER_SHARE

    # -- the search -----------------------------------------------------------------------

    def run(self) -> TuneOutcome:
        profile = self.profile = self._probe()
        if profile is not None and self.max_n >= 1:
            start = (profile.fed_workers(self.max_n) if self.has_consumer
                     else profile.peak_workers(self.max_n))
            climbs = self.has_consumer or profile.predict(start) > profile.predict(0)
            self.predicted = start if climbs else 0
            # else: the main process alone beats what any worker count can hand it (the
            # measured 0- and 1-worker trials already show it); climbing would waste trials.
            counts = plan.neighbourhood(start, self.max_n) if climbs else []
            top = max(counts, default=1)
            if not self.by_rate and self._floor_count(top) > top:
                counts.append(self._floor_count(top))
            self.on_plan(profile, start if climbs else 0,
                         [n for n in counts if n not in self._measured()])
            if climbs:
                self._climb(start)
                self._measure_neighbours(start)
        if not self.by_rate:
            self._measure_floor()
        self._confirm()
        groups = by_workers(self.trials)
        if not groups:
            raise NoSteadyState()
        recommendation = recommend(self.trials, profile, self.limits, self.has_consumer,
                                   self.batch_size, by_rate=self.by_rate)
        if self.out_of_budget:
            recommendation = replace(recommendation, reasons=(
                self._limit_reason(recommendation), *recommendation.reasons))
        elif self.time_limit.aimed:
            recommendation = replace(recommendation, reasons=(
                *recommendation.reasons, self._aim_reason()))
        return TuneOutcome(self.trials, profile, recommendation, self.limits, self.out_of_budget)

    def _limit_reason(self, recommendation: Recommendation) -> str:
        """The first line of a pick the user's time limit cut short: whether it reached the
        count the model predicts, and what was measured."""
        limit = self.time_limit.budget_s or 0.0
        if self.time_limit.by_promise:
            return self._promise_reason(recommendation)
        measured = ", ".join(str(n) for n in self._measured())
        pick = recommendation.kwargs["num_workers"]
        if self.predicted is None:
            return (f"Not the predicted best: your {limit:g} s time limit ran out before the "
                    "cost model could be learnt (it needs 0 and 1 worker measured). "
                    f"{pick} workers is the best of the counts measured ({measured}). "
                    "Tune again without a time limit (its plan says how long that takes).")
        if self.predicted not in self._measured():
            return (f"Not the predicted best: your {limit:g} s time limit ran out before "
                    f"{self.predicted} workers, the count the cost model predicts, could be "
                    f"measured. {pick} workers is the best of the counts measured ({measured}). "
                    "Tune again without a time limit (its plan says how long that takes).")
        return (f"Your {limit:g} s time limit ended the search early: {pick} workers is the best "
                f"of the counts measured ({measured}), the predicted count among them; "
                "neighbours or repeats were left out, so it is less sure.")

    def _aim_reason(self) -> str:
        """The line of a search that left trials out to keep the time it aimed at (NOTE [ A
        tune's aim ], plan.py): what it measured, and how to run the whole plan."""
        measured = ", ".join(str(n) for n in self._measured())
        return (f"The tune aimed at ~{self.time_limit.aim_s or 0.0:.0f} s: it measured "
                f"{measured} workers and left out the neighbours or repeats that did not fit, "
                "so the pick is less sure than a whole plan's (tune with --budget-s for one: "
                "the plan's line says how long it takes).")

    def _promise_reason(self, recommendation: Recommendation) -> str:
        """The first line of a pick the tune's own announced at most cut short (NOTE [ An at
        most that holds ], plan.py)."""
        at_most = self.time_limit.promised_s or 0.0
        measured = ", ".join(str(n) for n in self._measured())
        pick = recommendation.kwargs["num_workers"]
        reached = (self.predicted is not None and self.predicted in self._measured())
        return (f"Cut short to keep the ~{at_most:.0f} s this tune announced as its most: "
                f"{pick} workers is the best of the counts measured ({measured})"
                + (", the predicted count among them; neighbours or repeats were left out, "
                   "so it is less sure." if reached else
                   f", short of {self.predicted} workers, the count the cost model predicts."
                   if self.predicted is not None else
                   ", before the cost model could be learnt.")
                + " Its batches ran slower than their first ones said: tune again with "
                  "--budget-s for a longer search.")

    def _probe(self) -> CostProfile | None:
        serial = self._measure(0, "probe")
        if self.max_n < 1:
            return None
        one = self._measure(1, "probe")
        if not serial or not one:
            return None
        self.by_rate = not self.has_consumer or step_works_cpu(one[0], self.step_on_cpu)
        cap = memory_max_workers(one[0], self.system, ranks=self.limits.local_world_size)
        if cap is not None:  # kept even where it does not bind: recommend() reads it
            self.max_n = min(self.max_n, cap)
            self.limits = replace(self.limits, memory_max_workers=cap)
        return costmodel.learn(serial[0], one[0], self.limits.cpu_budget, self.step_on_cpu)

    def _climb(self, start: int) -> None:
        current = max(1, min(start, self.max_n))
        self._measure(current)
        # Up while more workers pay.
        while not self.out_of_budget and current < self.max_n:
            nxt = min(grow(current), self.max_n)
            self._measure(nxt)
            new, old = self._score(nxt), self._score(current)
            if new is None or old is None or not self._better(new, old):
                break
            current = nxt
        # Down while fewer workers lose nothing against the best worker count so far.
        with_workers = {n: score for n in self._measured()
                        if n > 0 and (score := self._score(n)) is not None}
        if not with_workers:
            return
        best = max(with_workers, key=lambda n: (with_workers[n], -n))
        current = best
        while not self.out_of_budget and current > 1:
            nxt = shrink(current)  # below best: best's trials, and so its score, stay as they are
            self._measure(nxt)
            new = self._score(nxt)
            if new is None or not self._no_worse(new, with_workers[best]):
                break
            current = nxt

    def _measure_neighbours(self, predicted: int) -> None:
        """The predicted count's neighbours the climb passed by, measured as the plan said:
        a climb up from 3 on 2 cores (ImageNet-style JPEGs, trials of +-20%) went on to 4, 6
        and 9 on noise and came down from 6 to 4 only, never measuring 2, the grid's best."""
        for n in plan.neighbourhood(predicted, self.max_n):
            if self.out_of_budget:
                return
            self._measure(n)

    def _measured(self) -> list[int]:
        """The worker counts measured that memory allows (a probe may be above the cap)."""
        return sorted({t.num_workers for t in self.trials if t.num_workers <= self.max_n})

    def _measure_floor(self) -> None:
        """Measure one high worker count once: "fed" is judged against the least idle any
        setting reaches, and the climb stops as soon as a step gains under 2 points, which can
        leave a slow decline (seen: 11 % idle at 4 workers, 9 % at 24) unmeasured."""
        top = max(self._measured())
        ceiling = self._floor_count(top)
        if ceiling > top and not self.out_of_budget:
            self._measure(ceiling, "floor")

    def _floor_count(self, top: int) -> int:
        return floor_count(top, self.max_n)


    def _confirm(self) -> None:
        """Re-measure, interleaved, the candidates whose order noise could flip."""
        scores = {n: s for n in self._measured() if (s := self._score(n)) is not None}
        if len(scores) < 2:
            return
        leaders = close_leaders(scores) if self.by_rate else self._fed_boundary(scores)
        for n in leaders:
            self._measure(n, "confirm", 1)

    def _fed_boundary(self, scores: dict[int, float]) -> list[int]:
        """With a consumer the decision is where "fed" begins: the current pick and the count
        just below it, when that one's idle is near enough the band for noise to decide
        (trials this short measure idle to about +-1.5 points)."""
        pick, _ = pick_fed(by_workers([t for t in self.trials if t.num_workers <= self.max_n]))
        best = max(scores.values())  # scores are -idle
        below = [n for n in scores if n < pick]
        if below and scores[max(below)] >= best - 2 * LESS_IDLE_GAIN:
            return [max(below), pick]
        least_idle = max(scores, key=lambda n: scores[n])
        if pick != least_idle and scores[pick] < best - LESS_IDLE_GAIN / 2:
            return [pick, least_idle]  # the pick sits in the band's upper half
        return []


def close_leaders(scores: dict[int, float]) -> list[int]:
    """The two fastest worker counts, when the runner-up is close enough for noise to swap
    them (the confirm step re-measures them)."""
    best = max(scores.values())
    close = [n for n, s in scores.items() if s >= best * (1 - CONFIRM_WITHIN)]
    leaders = sorted(close, key=lambda n: (-scores[n], n))[:2]
    return leaders if len(leaders) == 2 else []


def step_works_cpu(one_worker: TrialResult, step_on_cpu: bool) -> bool:
    """The step keeps the main process on the CPU for at least STEP_CPU_SHARE of its time
    (NOTE [ A step on the CPU ]); with one worker the main process's CPU is mostly the step's."""
    step, main_cpu = one_worker.step_ms, one_worker.main_cpu_ms
    return bool(step_on_cpu and step and main_cpu is not None
                and main_cpu >= STEP_CPU_SHARE * step)


def floor_count(top: int, max_workers: int) -> int:
    """The high count measured for the idle floor above ``top`` workers."""
    return min(max_workers, max(FLOOR_MIN_WORKERS, 2 * top))
