"""Threads per worker as a dimension of the offline search: each worker's thread pools as the
libraries start them, or limited to one thread (NOTE [ Threads per worker ],
instrument/threads.py).

NOTE [ Deciding threads during the search ]

    Decided once, at the first trial whose workers keep more threads busy than there are usable
    CPUs, with a library pool among them (oversubscription.oversubscribed): that worker count is then
    measured again, limited to one thread (twice) and as it was (once more), in turn (A B B A
    with the first trial as the first A). Limited is kept when faster by MIN_GAIN and beyond
    both sides' noise; then every later trial of the search runs limited, so the search climbs
    on the setting the job will run. The trials before it (0 and 1 workers, where the pools
    did not oversubscribe) stay as they ran: each trial is the setting it measured, and the
    recommendation carries the pick's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from dataloader_tuner.analyse.oversubscription import (POOL_NAMES, Oversubscribed,
                                                       oversubscribed)
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.claim import in_turn
from dataloader_tuner.tune.recommend import Recommendation
from dataloader_tuner.tune.side_check import MIN_GAIN, SideDecision

DEFAULT_PHASE, LIMITED_PHASE = "threads_default", "threads_one"


def found_in(trial: TrialResult, cpus_usable: float) -> Oversubscribed | None:
    """The trial's workers oversubscribed by a pool LimitThreads can size down."""
    if not trial.num_workers or trial.worker_threads == 1 or trial.helper_cpu_share is None:
        return None
    found = oversubscribed([trial.worker_pools or {}],
                           [(trial.helper_cpu_share, trial.busy_threads or 1)],
                           trial.num_workers, cpus_usable, trial.worker_cpu_ms)
    return found if found is not None and found.limits_can_help else None


@dataclass
class ThreadsDecision(SideDecision):
    """The search's threads setting, decided once (NOTE [ Deciding threads during the search ])."""

    cpus_usable: float = field(kw_only=True)
    worker_threads: int | None = None  # what later trials run with

    def check(self, first: TrialResult,
              measure: Callable[[int | None, int], TrialResult | None],
              report: Callable[[TrialResult], None]) -> TrialResult:
        """``first``, a search trial, or the trial to stand for its worker count once the
        threads are decided; ``measure(worker_threads, repeat)`` runs one more trial of its
        settings, ``report`` shows a trial the search does not keep."""
        if self.decided:
            return first
        found = found_in(first, self.cpus_usable)
        if found is None:
            return first
        self.decided = True
        limited = [measure(1, 0), measure(1, 1)]
        again = measure(None, 1)
        as_started = [first, again]
        chosen, self.reason = decide(as_started, limited, found, first.num_workers,
                                     self.cpus_usable)
        if chosen:
            self.worker_threads = 1
        kept = limited[0] if chosen and limited[0] is not None else first
        for trial in (*as_started, *limited):
            if trial is not None and trial is not kept:
                self.set_aside(replace(trial, phase=LIMITED_PHASE if trial.worker_threads == 1
                                       else DEFAULT_PHASE), report)
        return replace(kept, phase=first.phase, repeat=first.repeat)

    def recommend(self, recommendation: Recommendation, pick: list[TrialResult]
                  ) -> Recommendation:
        """The pick's own threads setting, with the reason line."""
        kwargs = dict(recommendation.kwargs)
        if not kwargs.get("num_workers"):  # no workers, no pools of theirs to speak of
            return recommendation
        if pick and all(t.worker_threads == 1 for t in pick):
            kwargs["worker_threads"] = 1
        elif self.worker_threads == 1:  # the pick's count was measured before it was decided
            return replace(recommendation, kwargs=kwargs)
        reasons = recommendation.reasons + ((self.reason,) if self.reason else ())
        return replace(recommendation, kwargs=kwargs, reasons=reasons)


def decide(as_started: list[TrialResult | None], limited: list[TrialResult | None],
           found: Oversubscribed, workers: int, cpus_usable: float) -> tuple[bool, str]:
    """(limit each worker's pools to one thread, the reason line)."""
    pool = POOL_NAMES.get(found.pool or "", found.pool)
    both = in_turn(as_started, limited)
    if both is None:
        return False, (f"One thread per pool in each worker was measured ({pool} had "
                       f"{found.pool_threads}) but a trial reached no steady state: the pools "
                       "stay as they start.")
    figures = (f"{both.rate_b:.0f} samples/s with one thread per pool in each worker against "
               f"{both.rate_a:.0f} with {pool}'s {found.pool_threads} (at {workers} "
               f"worker{'s' if workers != 1 else ''}, {len(both.b)} trials each, in turn"
               f"{both.noise_text()})")
    if both.b_pays(MIN_GAIN):
        return True, (f"worker_init_fn=dataloader_tuner.LimitThreads(): {figures}: "
                      f"{workers} worker(s) with {found.busy_threads} busy threads each were "
                      f"more than the {cpus_usable:g} CPU(s) run at once. The search went on "
                      "with one thread per pool.")
    return False, (f"One thread per pool in each worker was measured and did not pay beyond "
                   f"its noise: {figures}.")
