"""The search and the decision on simulated workloads and recorded trials: no timing here."""

import math
from dataclasses import replace

import pytest

from dataloader_tuner.tune import costmodel, plan
from dataloader_tuner.tune.recommend import Limits, pick_fastest, pick_fed, recommend
from dataloader_tuner.system import SystemSnapshot
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.time_limit import TimeLimit
from dataloader_tuner.tune.tuner import (FLOOR_MIN_WORKERS, Tuner, grow, memory_max_workers,
                                        shrink)

SYSTEM_DOC = {"cpus_usable": 2, "other_load_cpus": 0.0, "ram_available_mb": 20000,
              "shm": {"free_mb": 10000}, "gpu": {"available": False}}
SYSTEM = SystemSnapshot.from_dict(SYSTEM_DOC)


def trial(n, rate, idle=None, worker_ms=10.0, cpu_ms=9.0, main_cpu_ms=0.2, step_ms=0.0,
          startup=0.05, bytes_=4096, private_mb=20.0, phase="search", cv=0.1, **kw):
    return TrialResult(
        num_workers=n, prefetch_factor=None, persistent_workers=False, pin_memory=False,
        batch_size=16, samples_per_s=rate, batches=20, seconds=1.0, startup_s=startup,
        consumer_idle_frac=idle, latency_p50_ms=1.0, latency_p95_ms=2.0, worker_ms=worker_ms,
        worker_cpu_ms=cpu_ms, worker_ms_cv=cv, step_ms=step_ms, main_cpu_ms=main_cpu_ms,
        batch_bytes=bytes_, worker_private_mb=private_mb, phase=phase, **kw)


def limits(max_workers=32, length=4096, gpu=False):
    return Limits.from_system(SystemSnapshot.from_dict({**SYSTEM_DOC, "gpu": {"available": gpu}}),
                              1, max_workers, length)


class Simulated:
    """A workload defined by a throughput curve (samples/s per worker count); counts trials."""

    def __init__(self, curve, worker_ms, cpu_ms, main_cpu_ms=0.2, idle=None, step_ms=0.0):
        self.curve, self.calls = curve, []
        self.worker_ms, self.cpu_ms, self.main_cpu_ms = worker_ms, cpu_ms, main_cpu_ms
        self.idle, self.step_ms = idle, step_ms

    def __call__(self, spec):
        self.calls.append(spec.num_workers)
        n = spec.num_workers
        idle = self.idle(n) if self.idle else None
        return trial(n, self.curve(n), idle=idle, worker_ms=self.worker_ms, cpu_ms=self.cpu_ms,
                     main_cpu_ms=self.main_cpu_ms, step_ms=self.step_ms, phase=spec.phase)


def run(sim, has_consumer=False, max_workers=32, budget=None):
    tuner = Tuner(sim, limits(max_workers), SYSTEM, has_consumer=has_consumer,
                  step_on_cpu=False, time_limit=TimeLimit(budget), batch_size=16)
    return tuner.run()


def grid_best(curve, max_workers=32):
    return max(curve(n) for n in range(max_workers + 1))


def test_cpu_bound_peaks_near_the_core_count():
    # 10 ms per batch of 16, all CPU, 2 cores: 1600 samples/s per worker up to 2 workers
    curve = lambda n: 1300.0 if n == 0 else min(n, 2) * 1600.0 * (0.99 ** max(n - 2, 0))
    sim = Simulated(curve, worker_ms=10.0, cpu_ms=9.8)
    outcome = run(sim)
    n = outcome.recommendation.kwargs["num_workers"]
    assert curve(n) >= 0.95 * grid_best(curve)
    assert len(sim.calls) <= 9


def test_latency_bound_jumps_to_many_workers():
    # 160 ms per batch, almost no CPU: scales linearly to 32 workers
    curve = lambda n: 49.0 if n == 0 else n * 50.0
    sim = Simulated(curve, worker_ms=160.0, cpu_ms=0.5)
    outcome = run(sim)
    # 31, the top's neighbour, measured too: within 4% of 32, the fewer workers are picked
    assert outcome.recommendation.kwargs["num_workers"] in (31, 32)
    assert sim.calls[:3] == [0, 1, 32]  # the model sends it straight to the top
    assert any("mostly waiting" in r for r in outcome.recommendation.reasons)


def test_tiny_samples_stay_in_the_main_process():
    curve = lambda n: 300000.0 if n == 0 else 40000.0 + 1000 * n
    sim = Simulated(curve, worker_ms=0.05, cpu_ms=0.05, main_cpu_ms=0.7)
    outcome = run(sim)
    assert outcome.recommendation.kwargs == {"batch_size": 16, "num_workers": 0,
                                             "pin_memory": False}
    assert set(sim.calls) == {0, 1}  # no climbing when the hand-off is the bottleneck
    assert any("hand-off" in r for r in outcome.recommendation.reasons)


def test_consumer_picks_fewest_workers_that_keep_it_fed():
    # step 12 ms, worker 16 ms/batch: idle falls until 2 workers, then flat
    idle = lambda n: {0: 0.6, 1: 0.25}.get(n, 0.03 + 0.001 * n)
    curve = lambda n: 16 / (0.012 + 0.016 * idle(n))
    sim = Simulated(curve, worker_ms=16.0, cpu_ms=15.0, idle=idle, step_ms=12.0)
    outcome = run(sim, has_consumer=True)
    assert outcome.recommendation.kwargs["num_workers"] == 2
    assert any("keep" in r or "waits" in r for r in outcome.recommendation.reasons)


def test_a_step_on_the_cpu_is_judged_by_the_loops_rate_not_its_idle():
    # cpu_mlp's shape on 2 CPUs: more workers stretch the step, so its idle share keeps falling
    # while the loop gets slower past 2 workers
    curve = lambda n: {0: 440.0, 1: 445.0, 2: 590.0}.get(n, 590.0 * 0.93 ** (n - 2))
    idle = lambda n: {0: 0.88, 1: 0.40, 2: 0.26}.get(n, 0.05)
    on_cpu = Simulated(curve, worker_ms=130.0, cpu_ms=128.0, main_cpu_ms=60.0, idle=idle,
                       step_ms=80.0)  # the main process on the CPU for 75% of the step
    tuner = Tuner(on_cpu, limits(), SYSTEM, has_consumer=True, step_on_cpu=True,
                  time_limit=TimeLimit(None), batch_size=16)
    outcome = tuner.run()
    assert tuner.by_rate and outcome.recommendation.kwargs["num_workers"] == 2
    assert "Your step works the CPU too" in outcome.recommendation.reasons[1]
    assert max(on_cpu.calls) < FLOOR_MIN_WORKERS  # no idle floor to look for
    # the same curves with a step that waits (a GPU's): the idle rule, as before
    waits = Simulated(curve, worker_ms=130.0, cpu_ms=128.0, main_cpu_ms=2.0, idle=idle,
                      step_ms=80.0)
    tuner = Tuner(waits, limits(), SYSTEM, has_consumer=True, step_on_cpu=True,
                  time_limit=TimeLimit(None), batch_size=16)
    assert tuner.run().recommendation.kwargs["num_workers"] > 2 and not tuner.by_rate


def seven_seconds_a_trial(set_up=lambda limit: None, budget_s=None):
    """A tuner whose trials take 7 s each on a fake clock, ``set_up(limit)`` before it runs:
    its outcome, and the counts measured."""
    now = [0.0]
    sim = Simulated(lambda n: 100.0 * (n + 1), worker_ms=100.0, cpu_ms=1.0)

    def seven_seconds_each(spec):
        now[0] += 7.0
        return sim(spec)
    limit = TimeLimit(budget_s, clock=lambda: now[0])
    set_up(limit)
    tuner = Tuner(seven_seconds_each, limits(), SYSTEM, has_consumer=False, step_on_cpu=False,
                  time_limit=limit, batch_size=16)
    return tuner.run(), sim.calls


def test_a_time_limit_stops_the_search_and_says_so_in_the_first_line():
    outcome, calls = seven_seconds_a_trial(budget_s=14)
    assert outcome.stopped_by_budget
    assert calls == [0, 1]  # the predicted count's trial did not fit the time left
    first = outcome.recommendation.reasons[0]
    assert first.startswith("Not the predicted best: your 14 s time limit ran out before 32 "
                            "workers"), first


def test_under_a_limit_the_predicted_count_starts_where_a_cut_trial_of_it_fits():
    """NOTE [ A count cut at the user's limit ]: after the probes the limit leaves less than
    the predicted count's whole trial but more than its warm-up and CUT_STEADY batches: it is
    measured (cut at the limit), not skipped (audio features, --budget-s 60: 1 worker picked,
    2 never measured)."""
    curve = lambda n: 25.9 if n == 0 else min(n, 2) * 25.5  # ~0.6 s batches
    probe = Tuner(Simulated(curve, worker_ms=610.0, cpu_ms=590.0, main_cpu_ms=1.0), limits(),
                  SYSTEM, has_consumer=False, step_on_cpu=False, time_limit=TimeLimit(None),
                  batch_size=16)
    probe.run()
    predicted = probe.predicted or 0
    whole = plan.modelled_trial_seconds(probe.profile, predicted)
    cut = plan.modelled_trial_seconds(probe.profile, predicted, plan.CUT_STEADY)
    assert predicted > 1 and cut < whole
    now = [0.0]
    sim = Simulated(curve, worker_ms=610.0, cpu_ms=590.0, main_cpu_ms=1.0)

    def seven_seconds_each(spec):
        now[0] += 7.0
        return sim(spec)
    tuner = Tuner(seven_seconds_each, limits(), SYSTEM, has_consumer=False, step_on_cpu=False,
                  time_limit=TimeLimit(14.0 + (cut + whole) / 2, clock=lambda: now[0]),
                  batch_size=16)
    outcome = tuner.run()
    assert sim.calls == [0, 1, predicted], sim.calls
    assert outcome.recommendation.kwargs["num_workers"] >= 2
    assert outcome.recommendation.reasons[0].startswith("Your "), outcome.recommendation.reasons


def test_under_the_aim_the_counts_it_must_see_are_measured_and_the_rest_left_out():
    """NOTE [ A tune's aim ]: trials of 7 s against an aim of 20 s: 0, 1 and the predicted
    count are measured past it; its neighbours and repeats are not, and the pick says so last,
    not as a limit's first line."""
    outcome, calls = seven_seconds_a_trial(lambda limit: limit.aim(20.0, claim_reserve_s=0.0))
    assert calls == [0, 1, 32] and not outcome.stopped_by_budget
    assert outcome.recommendation.kwargs["num_workers"] == 32
    last = outcome.recommendation.reasons[-1]
    assert last.startswith("The tune aimed at ~20 s: it measured 0, 1, 32 workers"), last


def test_the_predicted_count_s_neighbours_are_measured_where_the_climb_passed_them_by():
    """ImageNet-style JPEGs at batch 256 on 2 cores, as a real tune measured them (trials of
    +-20%): the model predicts 3, the climb goes up on noise to 4, 6 and 9 and back down to 4
    only. 2, the predicted count's neighbour (the grid's best), is measured too."""
    rates = {0: 221, 1: 218, 2: 352, 3: 248, 4: 301, 6: 358, 9: 335}
    sim = Simulated(lambda n: rates.get(n, 330), worker_ms=75.0, cpu_ms=70.0, main_cpu_ms=1.0)
    tuner = Tuner(sim, limits(), SYSTEM, has_consumer=False, step_on_cpu=False,
                  time_limit=TimeLimit(None), batch_size=16)
    outcome = tuner.run()
    assert tuner.predicted == 3 and {2, 3, 4} <= set(sim.calls), sim.calls
    assert outcome.recommendation.kwargs["num_workers"] == 2  # within 4% of 6's 358


def test_the_announced_at_most_stops_the_search_and_says_so_in_the_first_line():
    """NOTE [ An at most that holds ]: without a user's limit, batches slower than announced
    end the search at the at most the tune promised, and its first line says why."""
    # the search ends at 14 s, after the probes
    outcome, calls = seven_seconds_a_trial(lambda limit: limit.promise(16.0, last_batch_s=1.0))
    assert outcome.stopped_by_budget and calls == [0, 1]
    first = outcome.recommendation.reasons[0]
    assert first.startswith("Cut short to keep the ~16 s this tune announced as its most"), first
    assert "short of 32 workers, the count the cost model predicts" in first


def test_without_a_limit_the_search_reaches_the_predicted_count_on_slow_batches():
    # CPU-bound on 2 cores, 1 worker no faster than 0 (at ~1 s a batch the probes alone took
    # 50 s of the old 45 s budget): the search measures the count the model names (2) and its
    # neighbours.
    curve = lambda n: 259.0 if n == 0 else min(n, 2) * 255.0 * (0.98 ** max(n - 2, 0))
    sim = Simulated(curve, worker_ms=61.0, cpu_ms=59.0, main_cpu_ms=1.0)
    outcome = run(sim)
    assert {1, 2, 3} <= set(sim.calls)
    assert outcome.recommendation.kwargs["num_workers"] == 2
    assert not outcome.stopped_by_budget


def test_the_plan_names_the_predicted_count_and_what_is_left_to_measure():
    curve = lambda n: 259.0 if n == 0 else min(n, 2) * 255.0
    sim = Simulated(curve, worker_ms=61.0, cpu_ms=59.0, main_cpu_ms=1.0)
    plans = []
    tuner = Tuner(sim, limits(), SYSTEM, has_consumer=False, step_on_cpu=False,
                  time_limit=TimeLimit(None), batch_size=16,
                  on_plan=lambda profile, predicted, counts: plans.append((predicted, counts)))
    tuner.run()
    assert plans == [(3, [2, 3, 4])]  # 2 workers reach 0.96 of the CPU limit: 3 for 0.97


def test_with_a_cpu_step_the_fed_count_stops_at_what_the_cores_allow():
    # loading 600 ms of CPU a batch, a 200 ms CPU step, 2 cores: the CPUs make ~2.5 batches/s,
    # so the consumer's 5 batches/s of demand is out of reach; the model points at 2 workers.
    profile = costmodel.CostProfile(
        serial_ms=800.0, cycle_ms=610.0, worker_ms=600.0, worker_cpu_ms=590.0, main_cpu_ms=210.0,
        step_ms=200.0, step_on_cpu=True, cpu_budget=2.0, batch_bytes=1e6, startup_s=0.7)
    assert profile.fed_workers(32) == 2


def test_grow_and_shrink_steps():
    assert [grow(n) for n in (1, 3, 4, 8)] == [2, 4, 6, 12]
    assert [shrink(n) for n in (2, 4, 6, 32)] == [1, 3, 4, 21]


def test_memory_caps_the_worker_count():
    one = trial(1, 100, private_mb=1000.0, bytes_=100 * 2**20)
    cap = memory_max_workers(one, SystemSnapshot.from_dict(
        {"ram_available_mb": 12000, "shm": {"free_mb": 4000}}))
    assert cap == min(int(0.5 * 12000 / 1200), int(0.5 * 4000 / 200))


def test_the_memory_cap_counts_the_nodes_ranks_and_a_full_shm_allows_no_worker():
    one = trial(1, 100, private_mb=10.0, bytes_=10 * 2**20)
    system = SystemSnapshot.from_dict({"ram_available_mb": 100000, "shm": {"free_mb": 400}})
    assert memory_max_workers(one, system) == int(0.5 * 400 / 20)
    assert memory_max_workers(one, system, ranks=4) == int(0.5 * 400 / (4 * 20))
    full = SystemSnapshot.from_dict({"ram_available_mb": 100000, "shm": {"free_mb": 0.0}})
    assert memory_max_workers(one, full) == 0


def test_a_cap_of_no_workers_measures_no_more_workers_and_picks_the_main_process():
    sim = Simulated(lambda n: 1000.0 + 30 * n, worker_ms=10.0, cpu_ms=9.0)
    system = SystemSnapshot.from_dict({**SYSTEM_DOC, "shm": {"free_mb": 0.0}})
    tuner = Tuner(lambda spec: replace(sim(spec), batch_bytes=2**20), limits(), system,
                  has_consumer=False, step_on_cpu=False, time_limit=TimeLimit(None),
                  batch_size=16)
    outcome = tuner.run()
    assert sim.calls == [0, 1]  # the probes only: nothing above the cap is measured again
    assert outcome.recommendation.kwargs["num_workers"] == 0
    assert outcome.limits.memory_max_workers == 0


def test_cost_profile_limits():
    serial = trial(0, 1000.0)
    one = trial(1, 1600.0, worker_ms=10.0, cpu_ms=9.8, main_cpu_ms=0.2)
    profile = costmodel.learn(serial, one, cpu_budget=2.0, step_on_cpu=False)
    assert profile.cpu_share == pytest.approx(0.98)
    assert profile.limits(1)["cpu"] == pytest.approx(2 * 1000 / 10.0)
    assert profile.peak_workers(32) == 2
    assert profile.predict(0) == pytest.approx(1000 / 16)


def test_the_consumer_limit_reads_the_main_process_s_busiest_thread():
    """imagefolder_compose on a 16-CPU H100 machine: the main process's CPU a batch, all its
    threads, was ~6x what its busiest thread did (torch's pool copying pinned batches beside
    the loop). Read as one batch at a time it capped the prediction of 16 workers at a third
    of what they make; the consumer limit reads the busiest thread, the cpu limit all of it."""
    from dataclasses import replace as with_

    serial = trial(0, 100.0, worker_ms=300.0, cpu_ms=290.0)
    one = with_(trial(1, 105.0, worker_ms=300.0, cpu_ms=290.0, main_cpu_ms=29.0),
                main_thread_cpu_ms=4.5)
    profile = costmodel.learn(serial, one, cpu_budget=16.0, step_on_cpu=False)
    assert profile.main_thread_cpu_ms == 4.5
    assert profile.limits(16)["consumer"] == pytest.approx(1000 / 4.5)
    assert profile.limits(16)["cpu"] == pytest.approx(16 * 1000 / (290 + 29))
    whole = costmodel.learn(serial, with_(one, main_thread_cpu_ms=None), 16.0, False)
    assert whole.limits(16)["consumer"] == pytest.approx(1000 / 29)
    assert profile.predict(16) > 1.4 * whole.predict(16)
    assert profile.batch_cost(32, 64).limits()["cpu"] == pytest.approx(
        profile.limits(16)["cpu"] * 32)  # (the ceiling's cpu limit counts every thread too)


def test_the_cpu_limit_reads_the_cpu_a_batch_and_the_cores_got_where_workers_filled_them():
    """A CI run stated a ceiling of 1,727 samples/s for known_stages where plain loops made
    at most 1,500 (the tune's pick 1,536): the CPU a batch was the one worker's and the cores
    were all 2, where a CPU-bound loader leaves some idle and a VM's neighbours take some.
    The cpu limit reads the trials that filled the cores: the median CPU a batch, and the most
    cores they used (their median), where that is most of them; variants measured beside the loader
    and fewer workers do not count."""
    from dataclasses import replace as with_

    serial = trial(0, 800.0, worker_ms=10.0, cpu_ms=9.0)
    one = trial(1, 700.0, worker_ms=9.2, cpu_ms=9.0, main_cpu_ms=1.0, phase="probe")
    profile = costmodel.learn(serial, one, cpu_budget=2.0, step_on_cpu=False)
    assert profile.batch_cost(16, 8).limits()["cpu"] == pytest.approx(2 * 1000 / 10.0 * 16)
    busy = [trial(2, 2400.0, worker_ms=11.0, cpu_ms=10.2, main_cpu_ms=1.2),
            trial(3, 2380.0, worker_ms=16.0, cpu_ms=10.6, main_cpu_ms=1.0, phase="confirm"),
            trial(2, 2390.0, worker_ms=11.5, cpu_ms=10.4, main_cpu_ms=1.1, phase="final"),
            with_(trial(2, 3500.0, cpu_ms=5.0, main_cpu_ms=0.1), worker_threads=1),
            trial(2, 3500.0, cpu_ms=5.0, main_cpu_ms=0.1, phase="cached"),
            trial(2, 3500.0, cpu_ms=5.0, main_cpu_ms=0.1, keep_freed_memory=True)]
    read = costmodel.at_busy_cores(profile, [serial, one, *busy])
    assert (read.worker_cpu_ms, read.main_cpu_ms) == (10.4, 1.1)
    # the median trial's 2,390 samples/s: 149.4 batches/s of 11.5 ms of CPU, 1.718 cores of 2
    assert read.cpu_budget == pytest.approx(2390 / 16 * 11.5 / 1000)
    assert read.batch_cost(16, 8).limits()["cpu"] == pytest.approx(2390.0)
    # the start's reading of other load gave back, up to the cores (one rank's share of them)
    fuller = [with_(t, samples_per_s=t.samples_per_s * 1.25) for t in busy[:3]]
    assert costmodel.at_busy_cores(profile, fuller).cpu_budget == 2.0
    assert costmodel.at_busy_cores(profile, fuller, 0.2).cpu_budget == pytest.approx(
        1.25 * 2390 / 16 * 11.5 / 1000)
    assert costmodel.at_busy_cores(profile, fuller, 0.2, 2).cpu_budget == pytest.approx(2.1)
    # a loader that waits leaves the cores to others: not a reading of what they give
    waiting = [trial(2, 500.0, worker_ms=40.0, cpu_ms=2.0, main_cpu_ms=0.5)]
    assert costmodel.at_busy_cores(profile, waiting).cpu_budget == 2.0
    # a batch's CPU above its time (threads beside the fetch) is capped there, as learnt
    over = trial(2, 2400.0, worker_ms=9.0, cpu_ms=12.0, main_cpu_ms=1.0)
    assert costmodel.at_busy_cores(profile, [over]).worker_cpu_ms == 9.0
    assert costmodel.at_busy_cores(profile, [serial, one]) == profile  # none filled them


def test_pick_fastest_prefers_fewer_workers_within_what_a_trial_can_tell():
    groups = {2: [trial(2, 1000.0)], 3: [trial(3, 1035.0)], 4: [trial(4, 900.0)]}
    n, why = pick_fastest(groups)
    assert n == 2 and "within 4%" in why  # 3.4% apart: a trial's rate is known to +-4%
    apart = {2: [trial(2, 1000.0)], 3: [trial(3, 1050.0)]}
    assert pick_fastest(apart)[0] == 3  # 5% apart: more workers pay


def test_pick_fastest_says_when_throughput_was_still_rising_at_the_top():
    rising = {16: [trial(16, 750.0)], 24: [trial(24, 1120.0)], 32: [trial(32, 1500.0)]}
    n, why = pick_fastest(rising, limits(max_workers=32))
    assert n == 32 and "still rising" in why and "24 workers gave 1120" in why
    assert "--max-workers" in why
    n, why = pick_fastest(rising, limits(max_workers=64))  # short of the limit: the budget
    assert "still rising" in why and "a longer --budget-s" in why
    capped = replace(limits(max_workers=64), memory_max_workers=32)
    n, why = pick_fastest(rising, capped)
    assert "still rising" in why and "memory allows no more" in why
    flat = {16: [trial(16, 1480.0)], 32: [trial(32, 1500.0)]}
    n, why = pick_fastest(flat)
    assert n == 16 and "still rising" not in why


def test_pick_fed_uses_consumer_idle():
    groups = {1: [trial(1, 800, idle=0.30)], 2: [trial(2, 990, idle=0.04)],
              3: [trial(3, 1000, idle=0.03)]}
    n, why = pick_fed(groups)
    assert n == 2 and "4.0%" in why


def test_pick_fed_ignores_low_idle_bought_with_a_slower_step():
    # 3 workers idle least, but their CPU use stretched the step: the training got slower.
    groups = {0: [trial(0, 556, idle=0.40)], 1: [trial(1, 600, idle=0.05)],
              3: [trial(3, 389, idle=0.02)]}
    n, why = pick_fed(groups)
    assert n == 1 and "slowed the step" in why


def test_pin_memory_false_without_gpu_with_reason():
    rec = recommend([trial(0, 100), trial(1, 200)], None, limits(), False, 16)
    assert rec.kwargs["pin_memory"] is False
    assert any("no GPU is visible" in r for r in rec.reasons)


def test_pin_memory_true_only_when_measured_faster_on_gpu():
    faster = [trial(0, 100), trial(1, 200, h2d_ms=2.0, h2d_other_ms=0.8)]
    assert recommend(faster, None, limits(gpu=True), False, 16).kwargs["pin_memory"] is True
    same = [trial(0, 100), trial(1, 200, h2d_ms=1.0, h2d_other_ms=0.95)]
    assert recommend(same, None, limits(gpu=True), False, 16).kwargs["pin_memory"] is False


def test_persistent_workers_when_startup_is_a_real_share_of_an_epoch():
    slow_start = [trial(0, 100), trial(2, 1000, startup=0.5)]  # epoch 4096/1000 = 4.1 s
    rec = recommend(slow_start, None, limits(), False, 16)
    assert rec.kwargs["persistent_workers"] is True
    quick = [trial(0, 100), trial(2, 1000, startup=0.001)]
    assert recommend(quick, None, limits(length=10**7), False, 16).kwargs[
        "persistent_workers"] is False


def test_bursty_batches_get_a_deeper_prefetch():
    rec = recommend([trial(0, 100), trial(2, 1000, cv=0.9)], None, limits(), False, 16)
    assert rec.kwargs["prefetch_factor"] == 4


def test_uncertainty_is_reported_from_repeats():
    trials = [trial(0, 100), trial(2, 1000), trial(2, 1200, phase="confirm")]
    rec = recommend(trials, None, limits(), False, 16)
    assert rec.uncertainty_pct == pytest.approx(50 * 200 / 1100)
    assert any(w.code == "noisy_machine" for w in rec.warnings) is (rec.uncertainty_pct > 10)


def test_limits_divide_cpus_between_ranks():
    lim = Limits.from_system(SystemSnapshot.from_dict(
        {**SYSTEM_DOC, "cpus_usable": 16, "other_load_cpus": 4.0}), 4, 32, None)
    assert lim.cpu_budget == pytest.approx(3.0)
    assert math.isclose(Limits.from_system(SYSTEM, 1, 32, None).cpu_budget, 2.0)


def test_consumer_floor_and_fed_boundary_are_measured():
    # Idle declines slowly with more workers (as with torch's fd hand-off); 1 worker sits at
    # the edge of the 2-point band in its first trial and outside it when measured again.
    first = {}

    def idle(n):
        if n == 1:
            first[1] = first.get(1, 0) + 1
            return 0.105 if first[1] == 1 else 0.135
        return {0: 0.35, 2: 0.095, 3: 0.093, 4: 0.092, 8: 0.09}.get(n, 0.09)

    curve = lambda n: 900.0 if n else 800.0
    sim = Simulated(curve, worker_ms=8.0, cpu_ms=7.0, idle=idle, step_ms=14.0)
    outcome = run(sim, has_consumer=True)
    assert 8 in sim.calls  # the floor
    assert sim.calls.count(1) == 2  # the boundary re-measured
    assert outcome.recommendation.kwargs["num_workers"] == 2


def test_a_cgroup_quota_counts_for_the_budget_and_the_diagnostics_alike():
    """docker --cpus=2 on 16 cores: the tuner budgets 2 cores and the warning counts 2."""
    from dataloader_tuner.analyse import pitfalls

    system = SystemSnapshot.from_dict({**SYSTEM_DOC, "cpus_usable": 16, "cpu_quota": 2.0})
    assert system.cores == 2.0 and system.cpu_budget() == 2.0
    assert Limits.from_system(system, 1, 32, None).cpu_budget == 2.0
    found = pitfalls.cpu_oversubscription(4, system, 0.9)
    assert found[0].code == "more_workers_than_cpus" and "on 2 usable CPU(s)" in found[0].message
