"""What a tune will take, said before it is spent: trials counted in batches, seconds from the
first batch and then from the cost model; the user's limit is hard."""

import math
import os
import time

import pytest

from dataloader_tuner.record.cards import Consumer
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.record.trials import TrialResult, TunePlan
from dataloader_tuner.child.trial_run import TrialRunner
from dataloader_tuner.tune import plan
from dataloader_tuner.tune.time_limit import STOP_S, TimeLimit
from dataloader_tuner.tune.costmodel import CostProfile
from dataloader_tuner.tune.trial_rules import (CAP_BATCHES, CLAIM_WINDOW_S, HARD_CAP_S,
                                         MIN_STEADY_BATCHES, SEARCH_WINDOW_S)


# A trial's other fields, where a test reads only its count, rate, batches and spread
TRIAL_FIELDS = dict(prefetch_factor=None, persistent_workers=False, pin_memory=False,
                    batch_size=16, seconds=1.0, startup_s=0.0, consumer_idle_frac=None,
                    latency_p50_ms=None, latency_p95_ms=None, worker_ms=None,
                    worker_cpu_ms=None, worker_ms_cv=None, step_ms=None, main_cpu_ms=None,
                    batch_bytes=None, worker_private_mb=None, phase="probe")


def test_a_trial_is_its_warm_up_and_twenty_steady_batches_at_most_its_caps_thirty():
    assert plan.trial_seconds(1.0, 0) == pytest.approx(21.0)  # 1 warm-up batch + 20
    assert plan.trial_seconds(1.0, 0, steady=30) == pytest.approx(31.0)
    assert plan.trial_seconds(0.5, 2) == pytest.approx(24 * 0.5 + plan.FORK_S)  # 2 x 2 warm-up
    assert plan.trial_seconds(0.0001, 0) == pytest.approx(SEARCH_WINDOW_S)  # never under it
    # workers restarted at each of 3 epochs the trial crosses
    assert plan.trial_seconds(0.5, 2, restarts=3, restart_s=1.0) == pytest.approx(
        12.0 + plan.FORK_S + 3.0)


def test_the_imagenet_style_tune_is_announced_in_minutes():
    # ~0.95 s a batch of 256 in the main process, 2 cores; the module's 4 workers restart
    # every 4-batch epoch
    base = plan.Baseline(num_workers=4, persistent_workers=False, epoch_batches=4)
    predicted, counts = plan.first_counts(2.0, 32)
    assert (predicted, counts) == (2, [0, 1, 2, 3])
    made = plan.plan_tune(plan.guessed_batch_s(0.95, 2.0), 0.95, 2.0, counts, predicted, base,
                          spent_s=1.0, measured=0, budget_s=None, known=False)
    assert 100 < made.estimated_s < 300 < made.at_most_s < 600, made
    assert made.trials == 4 + plan.CONFIRM_TRIALS + 4 + plan.CACHE_TRIALS
    assert "each batch takes ~0.95 s" in made.text() and "min if every trial runs to its cap" in made.text()
    assert not made.cut_short
    limited = TunePlan(**{**made.to_dict(), "budget_s": 45.0})
    assert limited.cut_short and "your limit of 45 s will cut it short" in limited.text()
    # a second plan past the at most first announced (kept: NOTE [ An at most that holds ])
    promised = TunePlan(**{**made.to_dict(), "at_most_s": made.estimated_s / 2})
    assert promised.cut_short and "first announced as its most will cut it short" in \
        promised.text()


def test_before_any_trial_with_workers_each_is_expected_at_its_cap():
    """Workers hand batches in bursts: on 2 cores their trials mostly ran to their cap
    (cpu_mlp's, expected at 20 batches, made a first plan of ~35 s for a 47 s tune). So before
    any is measured, a trial of slow batches with workers is expected at its cap
    (WORKER_STEADY_GUESS); one of fast batches measures its window whatever is guessed (NOTE [
    Windows of a fixed length for fast batches ])."""
    base = plan.Baseline(num_workers=0, persistent_workers=False, epoch_batches=None)
    predicted, counts = plan.first_counts(2.0, 4)

    def first_plan(serial_s: float, steady_with_workers: float | None) -> TunePlan:
        return plan.plan_tune(plan.guessed_batch_s(serial_s, 2.0), serial_s, 2.0, counts,
                              predicted, base, spent_s=3.0, measured=0, budget_s=None,
                              known=False, spawned=1, steady_with_workers=steady_with_workers)

    settled, capped = first_plan(0.5, None), first_plan(0.5, plan.WORKER_STEADY_GUESS)
    assert settled.estimated_s < capped.estimated_s < capped.at_most_s
    assert capped.at_most_s == settled.at_most_s  # (every trial at its cap there already)
    fast, guessed = first_plan(0.01, None), first_plan(0.01, plan.WORKER_STEADY_GUESS)
    assert fast.estimated_s == pytest.approx(guessed.estimated_s)


def test_after_the_probes_each_count_is_estimated_at_its_predicted_rate():
    profile = CostProfile(serial_ms=100.0, cycle_ms=100.0, worker_ms=100.0, worker_cpu_ms=5.0,
                          main_cpu_ms=0.5, step_ms=0.0, step_on_cpu=False, cpu_budget=2.0,
                          batch_bytes=1e4, startup_s=0.1)
    batch_s = plan.modelled_batch_s(profile)
    assert batch_s(4) == pytest.approx(0.025)  # waiting work: 4 workers, 4 batches at once
    base = plan.Baseline(0, False, None)
    made = plan.plan_tune(batch_s, 0.1, 2.0, [7, 8, 9], 8, base, spent_s=5.0, measured=2,
                          budget_s=None, known=True)
    assert made.predicted_workers == 8 and made.trials == (2 + 3 + plan.CONFIRM_TRIALS + 4
                                                           + plan.CACHE_TRIALS)
    assert "reaching 8 workers" in made.text()
    same = plan.plan_tune(batch_s, 0.1, 2.0, [], 0, base, 5.0, 2, None, known=True)
    # the user's own count: no claim to measure
    assert same.trials == 2 + plan.CONFIRM_TRIALS + plan.CACHE_TRIALS
    assert "predicts loading in the main process" in same.text()


def test_fast_batches_are_announced_with_the_trial_clocks_four_second_cap():
    # ~0.045 ms batches (noisy_worker): each trial measures its window whole (NOTE [ Windows
    # of a fixed length for fast batches ]); a tune announced at ~5 s took 12-15 s when "at
    # most" still counted 30 batches a trial
    base = plan.Baseline(num_workers=2, persistent_workers=False, epoch_batches=None)
    predicted, counts = plan.first_counts(2.0, 32)
    made = plan.plan_tune(plan.guessed_batch_s(4.5e-5, 2.0), 4.5e-5, 2.0, counts,
                          predicted, base, spent_s=0.5, measured=0, budget_s=None, known=False,
                          spawned=1)
    # 0, 1, 2, 3, 2 confirmed twice and measured over samples held in RAM (made first), and
    # the freed-memory check's short trial of 1 fresh worker; the user's own count predicted:
    # no claim expected, but one at most (the search may pick another: it picked 0, and a
    # slow CI host took 49 s of an "at most ~46 s")
    cached = plan.CACHE_TRIALS
    trials, with_workers = 4 + plan.CONFIRM_TRIALS + cached, 3 + plan.CONFIRM_TRIALS + cached
    gather = plan.CACHE_BATCHES * 4.5e-5
    fresh = plan.SPAWN_S + (2 + plan.FAULT_BATCHES) * 4.5e-5
    assert made.trials == trials + 1 and fresh == plan.fresh_check_seconds(4.5e-5)
    assert made.estimated_s == pytest.approx(
        0.5 + fresh + trials * SEARCH_WINDOW_S + with_workers * plan.FORK_S + gather)
    # at most: also every check that may run (threads fetching, the threads decision, in and
    # out of order, the pick with all its settings: NOTE [ An at most that holds ]) and the
    # widest claim, the pick and the user's 2 workers in turn
    # (the end's trials, its claim and checks, measure a longer window than the search's)
    claim = 2 * plan.MAX_CLAIM_PAIRS
    search_checks = plan.IO_THREAD_TRIALS + plan.THREADS_DECISION_TRIALS
    end_checks = plan.ORDER_TRIALS + plan.FINAL_TRIALS
    assert made.at_most_s == pytest.approx(
        0.5 + fresh + (trials + search_checks) * SEARCH_WINDOW_S
        + (claim + end_checks) * CLAIM_WINDOW_S + gather
        + (with_workers + search_checks + claim + end_checks) * plan.FORK_S)
    decided = plan.plan_tune(plan.guessed_batch_s(4.5e-5, 2.0), 4.5e-5, 2.0, counts,
                             predicted, base, spent_s=0.5, measured=0, budget_s=None,
                             known=False, spawned=1, threads_pending=False)
    assert made.at_most_s - decided.at_most_s == pytest.approx(
        plan.THREADS_DECISION_TRIALS * (SEARCH_WINDOW_S + plan.FORK_S))
    assert "if every trial runs to its cap" in made.text()


def test_the_trial_clock_and_the_plan_cut_a_trial_at_the_same_time():
    from dataloader_tuner.child.trial_run import TrialClock
    from tests.records import columns_of, make_batches

    fast = TrialClock(columns_of(make_batches(40, workers=2)), 4, 2, SEARCH_WINDOW_S)
    first = 100.0 + 0.002  # its first batch handed over (t0 100, waited 2 ms)
    assert not fast.past_cap(first + SEARCH_WINDOW_S - 0.1, 40)  # 10 ms batches: the window..
    assert fast.past_cap(first + SEARCH_WINDOW_S + 0.1, 40)  # ...counted from the first batch
    slow = TrialClock(columns_of(make_batches(40, workers=2, period_s=1.0)), 4, 2,
                      SEARCH_WINDOW_S)
    capped = 1.0 * (4 + CAP_BATCHES)  # 1 s batches: 34 of them
    assert not slow.past_cap(first + capped - 0.5, 40) and slow.past_cap(first + capped + 0.5, 40)
    assert plan.capped_trial_seconds(1.0, 2) == pytest.approx(
        (4 + CAP_BATCHES) * 1.0 + plan.FORK_S)
    assert plan.capped_trial_seconds(1e-4, 2) == SEARCH_WINDOW_S + plan.FORK_S


def test_a_trial_of_fast_batches_measures_its_whole_window():
    """NOTE [ Windows of a fixed length for fast batches ]: a rate known to TARGET_CI after 1 s
    of even 10 ms batches does not end the trial before its window (it did after 0.6 s: such
    trials took 0.6-4 s and no plan could say which); the end's trials measure a longer one."""
    from dataloader_tuner.child.trial_run import TrialClock
    from dataloader_tuner.tune.trial_rules import window_s
    from tests.records import columns_of, make_batches

    def clock(n, window):
        made = TrialClock(columns_of(make_batches(n, workers=2), t0=time.monotonic() - 0.01 * n),
                          4, 2, window)
        made.started -= 0.01 * n
        return made

    assert not clock(100, SEARCH_WINDOW_S).enough()  # 1 s of batches, rate exact
    assert clock(4 + int(SEARCH_WINDOW_S / 0.01), SEARCH_WINDOW_S).enough()
    assert not clock(4 + int(SEARCH_WINDOW_S / 0.01), CLAIM_WINDOW_S).enough()
    assert window_s("final") == window_s("baseline") == CLAIM_WINDOW_S
    assert window_s("search") == window_s("probe") == SEARCH_WINDOW_S


def test_a_share_of_the_aim_stops_a_trial_only_once_its_rate_has_its_batches():
    """NOTE [ A tune's aim ]: a trial past its share stops, but not before MIN_STEADY_BATCHES
    (a claim's trials cut at their share of ImageNet-style batches slower than the model's had
    too few to believe, and nothing was claimed); a user's limit still cuts it anywhere."""
    from dataloader_tuner.child.trial_run import TrialClock
    from tests.records import columns_of, make_batches

    def clock(n, **kw):
        # batches whose pace swings +-40%: a rate not known to TARGET_CI by its own
        rows = [b._replace(t_request=b.t_request + 0.04 * (i % 3 - 1))
                for i, b in enumerate(make_batches(n, workers=2, period_s=0.1))]
        # (its batches end now: a share of 3 s is past, the cap of 120 s is not)
        made = TrialClock(columns_of(rows, t0=time.monotonic() - 0.1 * n), 4, 2,
                          SEARCH_WINDOW_S, **kw)
        made.started -= 10.0
        return made

    assert not clock(30).enough()  # no share: its rate still too loose (its cap 3.4 s on)
    assert clock(30, share_s=3.0).enough()
    assert not clock(4 + MIN_STEADY_BATCHES - 1, share_s=3.0).enough()
    assert clock(10, limit_s=3.0).enough()
    # the freed-memory check's fresh trial, read for its page faults: FAULT_BATCHES steady
    assert clock(4 + plan.FAULT_BATCHES, most_steady=plan.FAULT_BATCHES).enough()
    assert not clock(4 + plan.FAULT_BATCHES - 1, most_steady=plan.FAULT_BATCHES).enough()


def test_a_trial_whose_workers_start_slowly_is_not_cut_at_its_first_batch():
    """Workers spawned fresh (the freed-memory check) took ~5 s to import torch and the
    dataset's libraries: the clock, asked at the first batch before it joined the columns, cut
    the trial there (1 batch, no steady state, nothing decided)."""
    from dataloader_tuner.child.trial_run import TrialClock
    from dataloader_tuner.record.columns import BatchColumns

    clock = TrialClock(BatchColumns(time.monotonic()), 2, 1, SEARCH_WINDOW_S)
    clock.started -= 6.0  # iter() six seconds ago; the first batch in hand, not yet in columns
    assert not clock.enough()
    clock.started -= HARD_CAP_S  # a first batch that never comes is still cut
    assert clock.enough()


def test_a_time_limit_lets_a_trial_start_only_where_it_fits():
    now = [0.0]
    limit = TimeLimit(60.0, clock=lambda: now[0])
    now[0] = 40.0
    assert limit.left() == 20.0 and limit.fits(15.0) and not limit.reached
    assert not limit.fits(25.0) and limit.reached
    unlimited = TimeLimit(None, clock=lambda: now[0])
    assert unlimited.left() is None and unlimited.fits(1e9)


def test_under_a_limit_the_counts_the_tune_must_see_share_what_is_left():
    now = [0.0]
    limit = TimeLimit(60.0, clock=lambda: now[0])
    now[0] = 3.0
    assert limit.share(3) == pytest.approx(19.0)  # 0, 1 and the predicted count
    now[0] = 22.0
    assert limit.share(2) == pytest.approx(19.0) and limit.share(0) == pytest.approx(38.0)
    assert TimeLimit(None, clock=lambda: now[0]).share(3) is None
    promised = TimeLimit(None, clock=lambda: now[0])
    promised.promise(600.0, 1.0)  # an at most announced is no reason to cut trials short
    assert promised.share(3) is None


def test_without_a_limit_the_tune_aims_and_keeps_time_for_its_claim():
    """NOTE [ A tune's aim ]: the counts the tune must see share the aim less the claim's
    reserve; other trials start only where they fit in it, the must-see ones regardless; the
    claim, once it starts, has the reserve; a user's limit replaces the aim."""
    now = [0.0]
    limit = TimeLimit(None, clock=lambda: now[0])
    assert limit.share(3) is None and limit.fits(1e9)  # no aim said yet
    limit.aim(90.0, claim_reserve_s=24.0)
    now[0] = 6.0
    assert limit.share(3) == pytest.approx((90.0 - 24.0 - 6.0) / 3)
    now[0] = 50.0
    assert limit.fits(16.0) and not limit.aimed
    assert not limit.fits(17.0) and limit.aimed and not limit.reached  # no cut said
    assert limit.fits(500.0, must=True)  # a count it must see: only a limit stops it
    limit.claiming()
    assert limit.aim_left() == pytest.approx(40.0) and limit.fits(39.0)
    now[0] = 95.0
    assert limit.share(2) == 0.0 and limit.fits(30.0, must=True)
    theirs = TimeLimit(60.0, clock=lambda: now[0])
    theirs.aim(90.0, claim_reserve_s=24.0)
    now[0] += 60.0
    assert theirs.aim_s is None and not theirs.fits(1.0, must=True) and theirs.reached


def _planner(num_workers: int, budget_s=None):
    from dataloader_tuner.tune.planner import Planner

    from .test_tuner import limits

    plans: list[TunePlan] = []
    limit = TimeLimit(budget_s, clock=lambda: 0.0)
    planner = Planner(LoaderConfig(batch_size=256, num_workers=num_workers), limits(), False,
                      limit, plans.append, fresh_check=True)
    return planner, limit, plans


def test_a_quick_tune_says_its_time_after_the_probes():
    """NOTE [ Said after the probes ]: detection's shape, ~1 ms batches and a hand-off from a
    worker costing 5: the first line says the probes and the at most; the plan after them is
    the time announced, without the repeats and the claim the probes already rule out (the
    user's own 0 workers far ahead of 1; 13 trials were said, and ~27 s for an 11.5 s tune),
    and with the pick's trials with threads fetching where its batches mostly wait."""
    planner, limit, plans = _planner(num_workers=0)
    planner.first(0.001)
    first = plans[-1]
    assert first.probing and "measuring 0 and 1 worker first (~" in first.text()
    assert first.estimated_s < plan.PROBES_FIRST_S and first.at_most_s == limit.promised_s

    def probes(one_rate: float) -> list[TrialResult]:
        return [TrialResult(num_workers=0, samples_per_s=15000.0, batches=2000,
                            **TRIAL_FIELDS),
                TrialResult(num_workers=1, samples_per_s=one_rate, batches=180, **TRIAL_FIELDS)]

    def profile(worker_cpu_ms: float) -> CostProfile:
        return CostProfile(serial_ms=1.0, cycle_ms=5.0, worker_ms=1.0,
                           worker_cpu_ms=worker_cpu_ms, main_cpu_ms=5.0, step_ms=0.0,
                           step_on_cpu=False, cpu_budget=2.0, batch_bytes=1e4, startup_s=0.1)

    planner.after_probes(profile(1.0), 0, [], probes(1500.0))
    said = plans[-1]
    assert not said.probing and said.trials == 2 + plan.CACHE_TRIALS
    doc = planner.to_dict()
    assert doc["announced_s"] == said.estimated_s and doc["announced_at_most_s"] == first.at_most_s
    planner.after_probes(profile(1.0), 0, [], probes(14000.0))  # close: confirmed
    assert plans[-1].trials == said.trials + plan.CONFIRM_TRIALS
    planner.after_probes(profile(0.1), 0, [], probes(1500.0))  # 1 ms of which 0.1 on the CPU
    assert plans[-1].trials == said.trials + plan.IO_THREAD_TRIALS
    assert plans[-1].estimated_s > said.estimated_s
    # a count that climbs: the end's claim expected only where the model has it faster than
    # the user's own 0 (audio_like's step fed at 2 workers, 0 twice as fast: 0 kept, no claim)
    planner.after_probes(profile(1.0), 2, [1, 2, 3], probes(1500.0))
    no_claim = plans[-1].trials
    workers_pay = CostProfile(serial_ms=10.0, cycle_ms=10.0, worker_ms=10.0, worker_cpu_ms=10.0,
                              main_cpu_ms=0.1, step_ms=0.0, step_on_cpu=False, cpu_budget=2.0,
                              batch_bytes=1e4, startup_s=0.1)
    assert workers_pay.predict(2) > workers_pay.predict(0)
    planner.after_probes(workers_pay, 2, [1, 2, 3], probes(1500.0))
    assert plans[-1].trials == no_claim + 2 * plan.CLAIM_PAIRS
    slow, _, slow_plans = _planner(num_workers=0)
    slow.first(0.5)  # its probes alone take longer: the plan is said at once
    assert not slow_plans[-1].probing


def test_a_plan_longer_than_the_aim_says_the_aim_and_how_to_run_the_whole_plan():
    """Audio features at ~0.7 s a batch: the whole plan is minutes; the tune says it aims at
    ~1.5 min, its whole plan, and the --budget-s that runs it. Batches of 3 s make the counts
    it must see longer than that: the aim grows, and says why (at 0.95 s a batch, ~1.8 min).
    Fast batches: the whole plan fits, said as before."""
    planner, limit, plans = _planner(num_workers=0)
    planner.first(0.7)
    said = plans[-1]
    assert said.aim_s == limit.aim_s == pytest.approx(plan.AIM_S)
    assert said.estimated_s == pytest.approx(plan.AIM_S) and said.whole_plan_s > 150, said
    assert said.at_most_s == pytest.approx(plan.AIM_AT_MOST * plan.AIM_S)  # not the plan's
    assert limit.promised_s == said.at_most_s
    assert 0 < limit.claim_reserve_s < 60  # one pair: 0 workers and the predicted 2
    text = said.text()
    assert "this tune aims at ~1.5 min, at most ~3.0 min (" in text and "past the usual" not in text
    assert f"--budget-s {math.ceil(said.whole_plan_s)} runs it" in text
    slow, slow_limit, slow_plans = _planner(num_workers=0)
    slow.first(3.0)
    assert slow_limit.aim_s > 1.5 * plan.AIM_S
    assert slow_plans[-1].estimated_s == slow_limit.aim_s
    assert "past the usual ~1.5 min: at that batch time" in slow_plans[-1].text()
    fast, fast_limit, fast_plans = _planner(num_workers=0)
    fast.first(0.01)
    assert fast_plans[-1].aim_s is None and fast_limit.aim_s == plan.AIM_S
    assert "measuring 0 and 1 worker first" in fast_plans[-1].text()  # NOTE [ Said after..
    theirs, their_limit, their_plans = _planner(num_workers=0, budget_s=300.0)
    theirs.first(0.95)
    assert their_limit.aim_s is None and their_plans[-1].aim_s is None


def test_the_at_most_announced_is_kept_as_a_limit_and_never_raised():
    """NOTE [ An at most that holds ]: the search ends a batch and STOP_S before the at most it
    announced, a later plan only lowers it, and a user's limit caps it."""
    now = [0.0]
    limit = TimeLimit(None, clock=lambda: now[0])
    assert limit.promise(60.0, last_batch_s=2.0) == 60.0
    now[0] = 40.0
    assert limit.left() == pytest.approx(60.0 - 2.0 - STOP_S - 40.0)
    assert limit.fits(10.0) and not limit.fits(20.0) and limit.reached and limit.by_promise
    assert limit.promise(90.0, last_batch_s=2.0) == 60.0  # the second plan cannot raise it
    assert limit.promise(50.0, last_batch_s=2.0) == 50.0
    now[0] = 0.0
    theirs = TimeLimit(30.0, clock=lambda: now[0])
    assert theirs.promise(60.0, last_batch_s=2.0) == 30.0  # at most the user's limit
    now[0] = 26.0
    assert not theirs.fits(5.0) and not theirs.by_promise  # the user's own limit ended it


def test_the_floor_sees_each_count_once_at_the_batches_its_spread_needs():
    """NOTE [ The floor ]: 0, 1, the predicted count and the user's own, once each; below the
    plan's estimate, and longer where the probes' rates were spread."""
    batch_s = plan.guessed_batch_s(0.3, 2.0)
    base = plan.Baseline(4, True, None)
    made = plan.plan_tune(batch_s, 0.3, 2.0, [2, 3], 2, base, spent_s=0.0, measured=0,
                          budget_s=None, known=True, max_workers=8)
    expected = sum(plan.trial_seconds(batch_s(n), n) for n in (0, 1, 2, 4))
    assert made.floor_s == pytest.approx(expected)
    assert made.floor_s < made.estimated_s < made.at_most_s
    assert "the least any tune of it can take here" in made.text()
    even = TrialResult(num_workers=0, samples_per_s=100.0, batches=20, rate_ci=0.03,
                       **TRIAL_FIELDS)
    spread = TrialResult(num_workers=1, samples_per_s=100.0, batches=20, rate_ci=0.08,
                         **TRIAL_FIELDS)
    assert plan.steady_to_tell([even]) == plan.MIN_STEADY_BATCHES
    assert plan.steady_to_tell([even, spread]) == pytest.approx(80.0)  # 20 x (8 / 4)^2
    wider = plan.floor_seconds(batch_s, 2, base, 8, steady=80.0)
    assert wider > made.floor_s
    # the estimate too: trials that need 80 batches to settle, up to their cap
    spread_plan = plan.plan_tune(batch_s, 0.3, 2.0, [2, 3], 2, base, spent_s=0.0, measured=0,
                                 budget_s=None, known=True, max_workers=8, steady=80.0)
    assert made.estimated_s < spread_plan.estimated_s < spread_plan.at_most_s


def test_a_spent_limit_starts_no_more_workers():
    # the decisions' extra trials (threads, freed memory) do not ask whether they fit: the
    # runner refuses them once the limit is spent, before a worker starts
    now = [0.0]
    limit = TimeLimit(10.0, clock=lambda: now[0])
    now[0] = 10.5
    reported = []
    runner = TrialRunner(None, Consumer("none"), reported.append, limit)
    assert runner.measure(LoaderConfig(batch_size=4, num_workers=2), "search") is None
    assert limit.reached and not reported


def test_no_trial_starts_where_its_workers_could_not_make_a_batch_in_the_time_left():
    """A trial is cut only once a batch comes: the freed-memory check's spawned workers
    (importing torch first, SPAWN_S) began with 0.3 s of a --budget-s 10 left and the tune took
    11.7 s. Less time left than the workers' start: none is started."""
    now = [0.0]
    limit = TimeLimit(10.0, clock=lambda: now[0])
    now[0] = 10.0 - plan.SPAWN_S + 0.2
    reported = []
    runner = TrialRunner(None, Consumer("none"), reported.append, limit)
    spawned = LoaderConfig(batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert runner.measure(spawned, "search") is None
    assert limit.reached and not reported


def test_the_plan_survives_the_wire():
    made = TunePlan(0.95, 12, 190.0, 2.0, predicted_workers=2, budget_s=45.0)
    assert TunePlan.from_dict(made.to_dict()) == made


def _short_epochs(epochs: int, per_epoch: int, workers: int, refill_s: float, batch_s: float):
    """Batches of ``workers`` persistent workers over epochs of ``per_epoch`` batches: each
    epoch's first batch waits ``refill_s`` (the pipeline refilled), the others ``batch_s``."""
    from tests.records import make_batches

    rows, t = [], 0.0
    for i, row in enumerate(make_batches(epochs * per_epoch, workers=workers)):
        wait = refill_s if i % per_epoch == 0 else batch_s
        rows.append(row._replace(epoch=i // per_epoch, t_request=t, wait_s=wait, step_s=0.0))
        t += wait
    return rows


def test_a_trial_over_short_epochs_is_known_by_whole_epochs():
    from dataloader_tuner.analyse import metrics
    from dataloader_tuner.tune.trial_rules import interval_block

    rows = _short_epochs(epochs=8, per_epoch=4, workers=2, refill_s=1.0, batch_s=0.1)
    warmup = 4
    assert interval_block(rows, warmup, 2) == 4
    by_round = metrics.rate_interval(rows, warmup, 2)
    by_epoch = metrics.rate_interval(rows, warmup, 4)
    assert by_epoch < 0.01 < 0.1 < by_round  # every block one epoch start: the same rate
    # long epochs (fewer than three in the window): a round of workers, as before
    assert interval_block(_short_epochs(2, 20, 2, 1.0, 0.1), 4, 2) == 2


def test_the_tune_says_what_it_announced_as_it_started():
    from dataloader_tuner.analyse.results import TuneResult

    def said(plan):
        return TuneResult.from_dict({"status": "ok", "plan": plan}).announced()

    assert said({"announced_s": 5.2, "announced_at_most_s": 31.0}) == "~5 s, at most ~31 s"
    assert said({"announced_s": 5.2}) == "~5 s"  # a document from before "at most" was kept
    assert said({"announced_s": 8.1, "announced_at_most_s": 46.0, "estimated_s": 47.2}) == (
        "~8 s, at most ~46 s; ~47 s after the first trials")
    assert said({"announced_s": 8.1, "estimated_s": 8.4}) == "~8 s"
    assert said(None) is None



def test_a_trial_reads_the_main_process_s_busiest_thread_beside_the_whole_process():
    """A real trial (known_stages, 1 worker): the main process's CPU a batch is read twice, all
    its threads and its busiest one; the busiest is part of the whole, and some of it (the
    loop receiving the batches)."""
    from dataloader_tuner.child.target import resolve

    from .conftest import dataset_path

    resolved = resolve(dataset_path("known_stages.py"))
    runner = TrialRunner(resolved, Consumer(), lambda t: None, TimeLimit(None))
    trial = runner.measure(LoaderConfig(batch_size=8, num_workers=1), "search", report=False)
    assert trial is not None
    assert trial.main_cpu_ms is not None and trial.main_thread_cpu_ms is not None
    # (a thread's CPU is counted in clock ticks, its user and system time each rounded down,
    # the process's exactly: two ticks over the trial's batches apart, 0.3 ms a batch for 20
    # ms over ~68; the quick suite once read the thread above the process)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    assert 0 < trial.main_thread_cpu_ms <= trial.main_cpu_ms + 2 * tick_ms / trial.batches, trial
