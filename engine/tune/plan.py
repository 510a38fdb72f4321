"""What a tune will cost, counted in batches and said in seconds before it is spent, and the
user's time limit over it.

NOTE [ A budget in batches ]

    A trial is believed after its warm-up and MIN_STEADY_BATCHES steady batches (trials.py),
    CAP_BATCHES where its rate is slow to settle, so a tune's cost is a count of batches, and
    its seconds follow from how long a batch takes:
    ~15 s for a loader of millisecond batches, minutes where a batch of 256 JPEGs takes a
    second. A budget in seconds fixed in advance (45 s, before) ran out on such a loader after
    measuring 0 and 1 workers, short of the count its own model named, and the end's claim
    then ran over it anyway (159 s). Now:

    - The plan is the trials the search needs to reach the count the cost model predicts and
      confirm it: the probes (0 and 1 worker), that count and its neighbours, the idle floor
      with a consumer, two confirming repeats, and the end's claim (the user's settings and
      the pick in turn, claim.CLAIM_PAIRS times). Its seconds are estimated from the first
      batch's time, then again from the model once the probes have measured (each count at
      its predicted rate), and announced (the Plan event: the CLI's line, the page's progress)
      as a range: trials that settle at MIN_STEADY_BATCHES and two pairs at the end, and at
      most every trial at its cap and the end's widest claim (MAX_CLAIM_PAIRS). A trial's cap
      is the trial clock's (trials.trial_cap_s): CAP_BATCHES, but never under its window,
      which a trial of fast batches measures whole (NOTE [ Windows of a fixed length for
      fast batches ], trials.py). The freed-memory check's workers start in a fresh
      interpreter (SPAWN_S each).
    - Without a limit the search runs to its end: the plan is what it will take.
    - A limit the user sets (--budget-s) is a hard ceiling over everything, the end's claim
      included: a trial starts only where its estimate fits the time left, and is cut at the
      limit. A pick made before the predicted count was measured says so in its first line.

NOTE [ A tune's aim ]

    Without a limit a tune aims at AIM_S (about a minute and a half), or, where batches are so
    slow that each count it must see (0 and 1 worker, the predicted count, the freed-memory
    check's fresh trial) and one pair of the end's claim need more, at that, each for
    MIN_STEADY_BATCHES. Its plan to the end (every neighbour, repeat and check, each trial to
    the spread it measured) took 4-5 minutes on
    ImageNet-style JPEGs at ~1 s a batch, where a search sharing 60 s picked the grid's best
    (issue 62). The aim is not a limit: the counts the tune must see share it (less the time
    kept for the claim), each trial stopping at its share once it has the batches a rate needs
    (a trial cut before them is too short to believe); other trials (neighbours, repeats, the
    checks) run only where they fit in what is left of it; the claim then has its first pair
    whatever is left, each trial stopping at half of it the same way, and more pairs only
    within the aim. A claim whose second pair did not fit is not made (NOTE [ A claim from two
    processes ], child/claiming.py): audio features with a CPU step at ~1 s a batch, one pair
    under the aim, claimed 1.69x +-4% where plain loops in fresh processes measured 1.35x; run
    to both pairs, the tune took 273 s where it had taken 172, to claim nothing (+-16%). Its at most is twice the aim (AIM_AT_MOST), kept as every at most is (NOTE [ An at
    most that holds ]). A user's --budget-s replaces the aim, as a hard limit.

NOTE [ Said after the probes ]

    Before a trial with workers, a plan cannot tell whether the search will climb: detection's
    first plan counted 13 trials (0-3 workers, repeats, a claim) where the 1-worker probe
    showed a batch cheaper than its hand-off from a worker, and the tune measured 0 and 1
    worker and stopped (11.5 s, said ~27 s; issue 62 asks for the time said within 25%). So
    where the probes take a few seconds (PROBES_FIRST_S at most, as the first batch's time
    says), the first line says only them and the at most, and the plan after them, from the
    cost model, is the time announced; a tune of slower batches says its plan at once, as
    before (its probes alone can take minutes), as does one whose plan the user's limit cuts
    short (the line says so before the first trial).

NOTE [ The floor ]

    The least a tune of this dataset can take on this machine: each count it must see (0 and
    1 worker, the count the model predicts, the user's own where the end compares them) seen
    once, its workers started and warmed, and steady for the batches that tell the leaders
    apart at the spread measured: a rate known to TARGET_CI takes MIN_STEADY_BATCHES where
    batches are even, and (ci / TARGET_CI)^2 times the batches a probe measured where they
    are not, up to the trial's cap (a trial of 0.056 ms batches read +-12.5% after 72,000 of
    them: its rate drifts, and no count of batches tells it closer). No repeats, no checks:
    what a perfect search would still pay. The tune says it beside its time (plan.floor_s;
    issue 62 asks for within 2x).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from dataloader_tuner.config import warmup_batches
from dataloader_tuner.record.trials import USUAL_AIM_S, TrialResult, TunePlan
from dataloader_tuner.tune.claim import CLAIM_PAIRS, MAX_CLAIM_PAIRS
from dataloader_tuner.tune.costmodel import CostProfile
from dataloader_tuner.tune.trial_rules import (CAP_BATCHES, CLAIM_WINDOW_S, MIN_STEADY_BATCHES,
                                         SEARCH_WINDOW_S, TARGET_CI, trial_cap_s)

AIM_S = USUAL_AIM_S  # NOTE [ A tune's aim ]
# ...and its at most, where the aim ends the tune first: its trials past their shares to their
# caps (30 batches, not 20) and a first batch that read fast (ImageNet-style JPEGs: 1.0 s, then
# 1.4 s a batch) still end well inside it (7 tunes took 0.93-1.07 of the aim, 2 cores)
AIM_AT_MOST = 2.0
CONFIRM_TRIALS = 2  # the leaders re-measured once each (tuner.py's confirm step)
FORK_S = 0.1  # a worker process started before it makes its first batch
# A worker started in a fresh interpreter (the freed-memory check's spawned workers, heap_check.py)
# imports torch and the dataset's module first: 1.1 s on the 2-core machine for a small module.
SPAWN_S = 1.5
# ...and measures this many batches past its warm-up: enough to count the pages its worker
# faults in a batch (NOTE [ Deciding freed memory during the search ], heap_check.py)
FAULT_BATCHES = 6
# NOTE [ Said after the probes ]: the longest the probes may take for the first line to say them
# alone (a user waits this long for the tune's time)
PROBES_FIRST_S = 10.0
# Before any trial with workers is measured, each is expected to settle after this many steady
# batches (or at its cap, if sooner): workers hand batches in bursts, so their rates take more
# batches to know than the loop's own 20 (88-256 measured, on 2 cores; at 20, the first plan
# said ~35 s of cpu_mlp's 47 s tune). Fast batches measure their window whatever this says.
WORKER_STEADY_GUESS = 150
# NOTE [ A count cut at the user's limit ]: the fewest steady batches a count the tune must see
# starts for, under the user's limit (half of what a rate needs to be known to TARGET_CI)
CUT_STEADY = MIN_STEADY_BATCHES // 2

# A trial's seconds: (batch_s, workers, restarts, restart_s, window=...) -> seconds
TrialTime = Callable[..., float]


def trial_seconds(batch_s: float, workers: int, restarts: int = 0, restart_s: float = 0.0,
                  steady: float = MIN_STEADY_BATCHES, window: float = SEARCH_WINDOW_S
                  ) -> float:
    """A trial of ``workers`` at ``batch_s`` a batch: its warm-up and ``steady`` batches (at
    least its ``window``: NOTE [ Windows of a fixed length for fast batches ], trials.py), its
    workers' start, and ``restarts`` epoch starts of ``restart_s``. A trial stops at
    MIN_STEADY_BATCHES where its rate is known by then, and at its cap's CAP_BATCHES where not
    (slow batches with a CPU step mostly ran there)."""
    batches = warmup_batches(workers, 2 if workers else 0) + steady
    start = FORK_S if workers else 0.0
    return max(batches * batch_s, window) + start + restarts * restart_s


def capped_trial_seconds(batch_s: float, workers: int, restarts: int = 0,
                         restart_s: float = 0.0, window: float = SEARCH_WINDOW_S) -> float:
    """A trial that never settles, so runs to its cap: CAP_BATCHES steady batches, and never
    less than the trial clock's time cap (trials.trial_cap_s: the window, for fast batches)."""
    at_cap = trial_seconds(batch_s, workers, restarts, restart_s, steady=CAP_BATCHES,
                           window=window)
    warmup = warmup_batches(workers, 2 if workers else 0)
    return max(at_cap, trial_cap_s(batch_s, warmup, max(workers, 1), window))


def fresh_check_seconds(batch_s: float) -> float:
    """The freed-memory check's trial: 1 worker started in a fresh interpreter, its warm-up
    and FAULT_BATCHES at ``batch_s`` a batch."""
    return SPAWN_S + (warmup_batches(1, 2) + FAULT_BATCHES) * batch_s


def probes_seconds(batch_s: Callable[[int], float], spawned: int) -> float:
    """The probes, 0 and 1 worker, and where ``spawned`` the freed-memory check's fresh trial
    after them."""
    return (settled_trial_seconds(batch_s(0), 0)
            + settled_trial_seconds(batch_s(1), 1, steady=WORKER_STEADY_GUESS)
            + spawned * fresh_check_seconds(batch_s(1)))


def guessed_batch_s(serial_batch_s: float, cores: float) -> Callable[[int], float]:
    """Before the model: each count's time per batch as if the work were CPU-bound (the
    slowest case likely: waiting work gets faster with more workers, CPU work only up to the
    cores)."""
    return lambda n: serial_batch_s / max(min(n, cores), 1.0)


def modelled_batch_s(profile: CostProfile) -> Callable[[int], float]:
    """After the probes: each count at the rate the cost model predicts."""
    return lambda n: 1.0 / profile.predict(n)


def modelled_trial_seconds(profile: CostProfile, workers: int,
                           steady: float = MIN_STEADY_BATCHES) -> float:
    """One trial of ``workers`` at the rate the cost model predicts, ``steady`` batches."""
    return trial_seconds(modelled_batch_s(profile)(workers), workers, steady=steady)


@dataclass(frozen=True)
class Baseline:
    """The user's settings as the end's claim will measure them."""

    num_workers: int
    persistent_workers: bool
    epoch_batches: int | None  # batches in an epoch (None: unknown or endless)


# The cache measured at a tune's end (child/cached.py): at most this long making the samples to
# hold, about this many batches of them
CACHE_GATHER_S = 5.0
CACHE_BATCHES = 256
CACHE_TRIALS = 2  # (their spread says how well the cached rate is known)
# ...and, where the fetch mostly waits, the pick with threads fetching (child/io_threads.py):
# only where the profile says so, so counted in the "at most", not the expected time
IO_THREAD_TRIALS = 2


def claim_seconds(batch_s: Callable[[int], float], pick: int, base: Baseline,
                  serial_batch_s: float, cores: float, pairs: int = CLAIM_PAIRS,
                  trial: TrialTime = trial_seconds,
                  steady: float = MIN_STEADY_BATCHES, second_process_s: float = 0.0) -> float:
    """The end's claim: the pick and the user's settings, ``pairs`` trials each, and from the
    second pair on the load of a second process (``second_process_s``: NOTE [ A claim from
    two processes ], child/claiming.py). Workers restarted each epoch pay their start again at
    every epoch the trial crosses (of ``steady`` batches after its warm-up)."""
    n = base.num_workers
    restarts, restart_s = 0, 0.0
    if n and not base.persistent_workers and base.epoch_batches:
        restarts = math.ceil((warmup_batches(n, 2) + steady) / base.epoch_batches)
        # every worker makes its first batch at once on the cores there are
        restart_s = FORK_S + serial_batch_s * max(n / max(cores, 1.0), 1.0)
    return (second_process_s * (pairs > 1)
            + pairs * (trial(batch_s(pick), pick, 0, 0.0, window=CLAIM_WINDOW_S)
                       + trial(batch_s(n), n, restarts, restart_s, window=CLAIM_WINDOW_S)))


def floor_seconds(batch_s: Callable[[int], float], predicted: int, base: Baseline,
                  max_workers: int, steady: float = MIN_STEADY_BATCHES) -> float:
    """NOTE [ The floor ]: each count the tune must see, once, for ``steady`` batches."""
    must_see = {n for n in (0, 1, predicted, base.num_workers) if n <= max_workers}
    return sum(settled_trial_seconds(batch_s(n), n, steady=steady) for n in must_see)


def settled_trial_seconds(batch_s: float, workers: int, restarts: int = 0,
                          restart_s: float = 0.0, steady: float = MIN_STEADY_BATCHES,
                          window: float = SEARCH_WINDOW_S) -> float:
    """A trial that settles after ``steady`` batches, or at its cap where that comes first (no
    trial runs past it: a spread that would need more is cut there too)."""
    return min(trial_seconds(batch_s, workers, restarts, restart_s, steady, window),
               capped_trial_seconds(batch_s, workers, restarts, restart_s, window))


def steady_to_tell(trials: Iterable[TrialResult]) -> float:
    """NOTE [ The floor ]: the steady batches a trial needs for its rate to be known to
    TARGET_CI at the spread ``trials`` measured (MIN_STEADY_BATCHES at the least)."""
    needed = [t.batches * (t.rate_ci / TARGET_CI) ** 2 for t in trials
              if t.rate_ci is not None and t.batches]
    return max(max(needed, default=0.0), MIN_STEADY_BATCHES)


def plan_tune(batch_s: Callable[[int], float], serial_batch_s: float, cores: float,
              to_measure: Iterable[int], predicted: int, base: Baseline, spent_s: float,
              measured: int, budget_s: float | None, known: bool, spawned: int = 0,
              max_workers: int = 1, steady: float = MIN_STEADY_BATCHES,
              threads_pending: bool = True, steady_with_workers: float | None = None,
              confirms: int = CONFIRM_TRIALS, threads_fetching: bool = False,
              second_process_s: float = 0.0) -> TunePlan:
    """The tune from here: ``to_measure`` the search's counts not measured yet, ``predicted``
    the count it confirms and compares with ``base`` at its end; ``measured`` trials so far in
    ``spent_s``; ``spawned``: the freed-memory check's trial is to come (fresh_check_seconds).
    ``known``: ``predicted`` comes from the cost model (not yet a guess). Expected with trials
    that settle after ``steady`` batches (the spread the probes measured: steady_to_tell) or at
    their cap, and a claim of CLAIM_PAIRS; at most with every trial at its cap, MAX_CLAIM_PAIRS,
    and every check that may run (NOTE [ An at most that holds ]), the claim counted even where
    ``predicted`` is the user's own count: the search may still pick another (noisy_worker's
    first plan, predicting the user's 2 workers, said at most ~46 s; the search picked 0, the
    claim ran, and a slow host took 49 s). ``threads_pending``: the threads decision may still
    measure its trials (thread_pools.py). ``steady_with_workers``: the steady batches a trial
    with workers settles after, where it differs from ``steady`` (before the probes:
    WORKER_STEADY_GUESS). ``confirms``: the leaders' repeats expected (CONFIRM_TRIALS, or
    what the probes already tell); ``threads_fetching``: the pick is to be measured with
    threads fetching (IO_THREAD_TRIALS; in the at most whatever this says);
    ``second_process_s``: the load of the claim's second process (claim_seconds). Once ``known``, no
    claim is expected where the model has the user's own count at least as fast as
    ``predicted`` (the search then mostly keeps it; one is still in the at most)."""
    counts = list(to_measure)
    # the user's own count expected: no claim at the end
    claims = predicted != base.num_workers and (
        not known or batch_s(predicted) < batch_s(base.num_workers))

    def settling(batch_s: float, workers: int, restarts: int = 0, restart_s: float = 0.0,
                 window: float = SEARCH_WINDOW_S) -> float:
        batches = steady if not workers or steady_with_workers is None else steady_with_workers
        return settled_trial_seconds(batch_s, workers, restarts, restart_s, batches, window)

    def total(trial: TrialTime, steady: float, pairs: int) -> float:
        search = (sum(trial(batch_s(n), n, 0, 0.0) for n in counts)
                  + spawned * fresh_check_seconds(batch_s(1)))
        at_pick = trial(batch_s(predicted), predicted, 0, 0.0)
        end = claim_seconds(batch_s, predicted, base, serial_batch_s, cores, pairs,
                            trial, steady, second_process_s) if pairs else 0.0
        # the pick over samples held in RAM (child/cached.py): making them, then a trial
        cache = min(CACHE_GATHER_S, CACHE_BATCHES * serial_batch_s) + CACHE_TRIALS * at_pick
        if trial is capped_trial_seconds:
            end_trial = trial(batch_s(predicted), predicted, 0, 0.0, window=CLAIM_WINDOW_S)
            checks = checks_at_most(threads_pending, at_pick, end_trial)
            repeats = CONFIRM_TRIALS
        else:
            checks, repeats = IO_THREAD_TRIALS * threads_fetching * at_pick, confirms
        return spent_s + search + repeats * at_pick + end + cache + checks

    return TunePlan(
        seconds_per_batch=serial_batch_s,
        trials=(measured + len(counts) + spawned + confirms + 2 * CLAIM_PAIRS * claims
                + CACHE_TRIALS + IO_THREAD_TRIALS * threads_fetching),
        estimated_s=total(settling, MIN_STEADY_BATCHES, CLAIM_PAIRS if claims else 0),
        spent_s=spent_s, predicted_workers=predicted if known else None, budget_s=budget_s,
        at_most_s=total(capped_trial_seconds, CAP_BATCHES, MAX_CLAIM_PAIRS),
        floor_s=floor_seconds(batch_s, predicted, base, max_workers, steady))


# Trials only some tunes run, counted in the at most (NOTE [ An at most that holds ]): threads
# fetching (child/io_threads.py), the threads decision's three (thread_pools.py), the pick in
# and out of order in turn (order.py), the pick measured with all its settings (tuning.py)
THREADS_DECISION_TRIALS = 3
ORDER_TRIALS = 2 * CLAIM_PAIRS
FINAL_TRIALS = 1


def checks_at_most(threads_pending: bool, search_trial_s: float, end_trial_s: float) -> float:
    """The seconds the checks may add at the pick, at most: their trials of the search's
    window (threads) and of the end's (in and out of order, the pick with all its settings)."""
    return ((IO_THREAD_TRIALS + THREADS_DECISION_TRIALS * threads_pending) * search_trial_s
            + (ORDER_TRIALS + FINAL_TRIALS) * end_trial_s)


def first_counts(cores: float, max_workers: int) -> tuple[int, list[int]]:
    """Before the model: the count a CPU-bound loader would need (the cores) and the search's
    counts around it, the probes included."""
    predicted = max(1, min(math.ceil(cores), max_workers))
    return predicted, neighbourhood(predicted, max_workers, [0, 1])


def neighbourhood(predicted: int, max_workers: int, also: Iterable[int] = ()) -> list[int]:
    """The predicted count and its neighbours within 1..max_workers, with ``also``."""
    near = {n for n in (predicted - 1, predicted, predicted + 1) if 1 <= n <= max_workers}
    return sorted(near | set(also))
