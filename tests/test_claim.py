"""The speedup a tune claims comes from the end of the tune: the user's settings and the pick
measured in turn, start-up charged as the job pays it, drift while tuning said."""

import dataclasses

import pytest

from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.tune import claim
from dataloader_tuner.tune.same_settings import same_settings

from .test_tuner import trial


def test_the_sides_are_measured_in_turn_the_order_swapped_each_pair():
    order = []

    def measuring(name):
        def measure(repeat):
            order.append((name, repeat))
            return trial(0 if name == "base" else 2, 100.0)
        return measure

    base, pick = claim.alternate(measuring("base"), measuring("pick"), pairs=3)
    assert order == [("base", 0), ("pick", 0), ("pick", 1), ("base", 1), ("base", 2),
                     ("pick", 2)]
    assert len(base) == len(pick) == 3


def test_a_claim_is_the_ratio_of_the_ends_means_known_by_its_pairs():
    base = [trial(0, 100.0, rate_ci=0.03), trial(0, 110.0, rate_ci=0.03)]
    pick = [trial(2, 200.0, rate_ci=0.02), trial(2, 190.0, rate_ci=0.02)]
    result = claim.end_claim(base, pick, epoch_items=None)
    assert result.speedup == pytest.approx(195.0 / 105.0)
    # the wider of both sides' trial intervals (each narrowed by two) and half the range of
    # the pairs' ratios (2.0 and 1.727)
    within = ((100 * 0.03 / 2 ** 0.5) ** 2 + (100 * 0.02 / 2 ** 0.5) ** 2) ** 0.5
    ratios = [2.0, 190.0 / 110.0]
    spread = 50 * (max(ratios) - min(ratios)) / (sum(ratios) / 2)
    assert result.speedup_pct == pytest.approx(max(within, spread))
    doc = result.to_dict()
    assert doc["speedup_note"] is None and "alternating" in doc["claimed_from"]


def test_a_slow_minute_shared_by_both_sides_of_a_pair_does_not_widen_the_claim():
    # the machine ran 30% slower during the second pair: each side's rates range +-13%, their
    # ratio not at all
    base = [trial(0, 100.0, rate_ci=0.03), trial(0, 77.0, rate_ci=0.03)]
    pick = [trial(2, 200.0, rate_ci=0.03), trial(2, 154.0, rate_ci=0.03)]
    result = claim.end_claim(base, pick, epoch_items=None)
    assert result.speedup == pytest.approx(2.0) and not result.too_wide
    assert result.speedup_pct == pytest.approx(3.0)  # both sides' intervals, each over 2


def test_no_claim_from_a_trial_too_short_or_without_a_steady_state():
    short = claim.end_claim([trial(0, 100.0, conclusive=False), trial(0, 100.0)],
                            [trial(2, 200.0), trial(2, 200.0)], None)
    assert short.speedup is None and "the baseline" in short.note and "too short" in short.note
    missing = claim.end_claim([trial(0, 100.0), None], [trial(2, 200.0), trial(2, 200.0)], None)
    assert missing.speedup is None and "no steady state" in missing.note


def test_a_setting_that_restarts_its_workers_each_epoch_is_charged_its_start_up():
    # 16 samples a batch at 1600 samples/s: 10 ms a batch; 1.01 s to the first batch
    restarting = trial(4, 1600.0, startup=1.01)
    assert claim.startup_charge_s(restarting) == pytest.approx(1.0)
    # an epoch of 1600 samples takes 1 s, and 1 s more to start: half the rate
    assert claim.charged_rate(restarting, 1600) == pytest.approx(800.0)
    assert claim.charged_rate(restarting, None) == 1600.0  # no length known: nothing charged
    paid = trial(4, 1600.0, startup=1.01, restarts_measured=2)  # its window crossed epochs
    assert claim.charged_rate(paid, 1600) == 1600.0
    assert claim.charged_rate(trial(0, 1600.0, startup=1.01), 1600) == 1600.0
    kept = dataclasses.replace(restarting, persistent_workers=True)
    assert claim.charged_rate(kept, 1600) == 1600.0
    result = claim.end_claim([restarting, restarting], [kept, kept], 1600)
    assert result.speedup == pytest.approx(2.0)
    assert "1.00 s of worker start-up per epoch" in claim.end_reason(result, "your settings")


def drift(early, late, who):
    found = claim.drifted(early, late)
    return claim.drift_warning(found, who) if found is not None else None


def test_a_setting_measured_faster_at_the_end_than_early_is_said_to_have_drifted():
    early = [trial(0, 100.0, rate_ci=0.03)]
    late = claim.side([trial(0, 190.0, rate_ci=0.03), trial(0, 195.0, rate_ci=0.03)], None)
    found = drift(early, late, "Your settings")
    assert found is not None and found.code == "drifted_while_tuning"
    assert "100 samples/s early" in found.message and "faster" in found.message
    steady = claim.side([trial(0, 104.0, rate_ci=0.03), trial(0, 98.0, rate_ci=0.03)], None)
    assert drift(early, steady, "Your settings") is None
    assert drift([], late, "Your settings") is None


def test_early_trials_compared_are_the_searchs_of_the_same_setting():
    early = [trial(2, 100.0), trial(2, 100.0, phase="prewarm"), trial(4, 100.0),
             dataclasses.replace(trial(2, 100.0), restarts_measured=1)]
    config = LoaderConfig(batch_size=16, num_workers=2, persistent_workers=True,
                          prefetch_factor=2)
    assert claim.comparable(early, config) == [early[0]]


def _tuned(dataset: str) -> dict:
    """The result document of a real tune of tests/datasets/``dataset`` (4 workers at most)."""
    from dataloader_tuner.run.runner import RunRequest, run_to_completion

    from .conftest import dataset_path

    handle = run_to_completion(RunRequest(target=dataset_path(dataset), kind="tune",
                                          max_workers=4))
    try:
        doc = handle.live.result(handle.state.value).to_dict()
    finally:
        handle.close()
    assert doc["status"] == "ok", doc.get("error")
    return doc


@pytest.mark.host_speed  # the tune's claim against plain loops run after it
@pytest.mark.slow  # a real tune (~20 s) and plain loops to check it
def test_a_store_that_warms_while_tuning_does_not_inflate_the_claim():
    """The user's settings are measured first, while the store is cold; the search's later
    trials read it warm. Measured early, the baseline made the pick look 25x faster; at the
    end, in turn with the pick, the claim is what plain loops on the warm store see."""
    from tests.datasets import warming_store
    from tests.real.plain_loop import plain_rate

    doc = _tuned("warming_store.py")
    baseline, recommended = doc["baseline"], doc["recommended"]
    drifted = [w for w in doc["warnings"] if w["code"] == "drifted_while_tuning"]
    # 0 workers: cold, then warm. The pick may drift too on a loaded machine; both are said.
    assert any(w["message"].startswith("Your settings") for w in drifted), drifted
    assert "end of the tune" in baseline["claimed_from"]
    if baseline["speedup"] is None:  # the pick slowed on a loaded machine: said, not claimed
        assert "slower there than earlier" in baseline["speedup_note"], baseline
        assert any(w["message"].startswith("The pick") for w in drifted), drifted
        return

    warming_store.dataset.warm_up()  # the store as the job reads it after its first epoch
    own = {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False}
    pick = {key: recommended.get(key) for key in own}
    pick["persistent_workers"] = bool(pick["persistent_workers"])
    ratios = []
    for pair in range(3):  # interleaved, the order swapped each pair
        sides = [own, pick] if pair % 2 == 0 else [pick, own]
        rates = {id(s): plain_rate(warming_store, 1.0, **s)["samples_per_s"] for s in sides}
        ratios.append(rates[id(pick)] / rates[id(own)])
    plain = sorted(ratios)[1]
    slack = 0.15 + (baseline["speedup_pct"] or 0) / 100
    assert abs(baseline["speedup"] / plain - 1) <= slack, (baseline, ratios)


def test_a_late_trial_that_paid_a_restart_is_not_taken_for_drift():
    early = [trial(2, 1000.0, rate_ci=0.02)]  # the search keeps its workers
    restarted = dataclasses.replace(trial(2, 700.0, rate_ci=0.02), restarts_measured=3)
    assert drift(early, claim.side([restarted, restarted], None), "Your settings") is None
    kept = trial(2, 700.0, rate_ci=0.02)  # no restart in its window: a real change
    assert drift(early, claim.side([kept, kept], None), "Your settings") is not None


def test_settings_dataloader_runs_alike_need_no_claim():
    explicit = LoaderConfig(batch_size=16, num_workers=2, prefetch_factor=2)
    assert same_settings(LoaderConfig(batch_size=16, num_workers=2), explicit)
    assert not same_settings(LoaderConfig(batch_size=16, num_workers=3), explicit)
    assert same_settings(LoaderConfig(batch_size=16, num_workers=0),
                               LoaderConfig(batch_size=16, num_workers=0, pin_memory=False))


def test_a_claim_wider_than_ten_percent_is_not_made_but_its_figures_are_kept():
    base = [trial(0, 100.0, rate_ci=0.03), trial(0, 130.0, rate_ci=0.03)]
    pick = [trial(2, 200.0, rate_ci=0.02), trial(2, 210.0, rate_ci=0.02)]
    result = claim.end_claim(base, pick, epoch_items=None)
    assert result.speedup is None and result.too_wide
    assert result.ratio == pytest.approx(205.0 / 115.0)
    assert result.speedup_pct > claim.CLAIM_WITHIN_PCT
    assert "205 samples/s against 115" in result.note and "too loosely" in result.note
    assert not result.slower


class FakeRunner:
    """TrialRunner's face for the end's pairs: rates from a list per phase, a time limit."""

    def __init__(self, rates, budget_s=None, rate_ci=0.02):
        from dataloader_tuner.tune.time_limit import TimeLimit

        self.rate_ci = rate_ci
        self.rates = {phase: list(values) for phase, values in rates.items()}
        self.time_limit = TimeLimit(budget_s, clock=lambda: 0.0)
        self.phases = []
        self.shares = []  # what each trial was given of the aim

    def measuring(self, config, phase, share_s=None):
        def measure(repeat):
            self.phases.append(phase)
            self.shares.append(share_s)
            return trial(config.num_workers, self.rates[phase].pop(0), rate_ci=self.rate_ci)
        return measure


def _pairs(runner):
    from dataloader_tuner.child.claiming import pairs_at_end as _pairs_at_end
    from dataloader_tuner.tune.recommend import Recommendation
    from dataloader_tuner.tune.tuner import TuneOutcome

    from .test_tuner import limits

    outcome = TuneOutcome([], None, Recommendation({"num_workers": 2}, 1.0, None, ()), limits())
    return _pairs_at_end(runner, LoaderConfig(batch_size=16), LoaderConfig(batch_size=16,
                                                                           num_workers=2),
                         outcome, None)


def test_the_end_measures_more_pairs_only_where_they_could_narrow_the_claim():
    """NOTE [ Pairs that cannot narrow a claim ]: trials known to +-12% each, their pairs'
    ratios agreeing: more pairs narrow the claim to under 10% and are measured. Where the
    pairs' ratios already disagree by 30% (half their range: 12%), more pairs can only widen
    that: none is measured (before, four pairs ran to the same no claim)."""
    loose = FakeRunner({"baseline": [100.0, 101.0, 100.0, 101.0],
                        "final": [200.0, 201.0, 200.0, 201.0]}, rate_ci=0.12)
    base, pick, result = _pairs(loose)
    # (three pairs: +-12% / sqrt(3) a side, +-9.8% together)
    assert len(base) == len(pick) == 3 and result.speedup is not None
    runner = FakeRunner({"baseline": [100.0, 130.0, 112.0, 118.0, 115.0],
                         "final": [200.0, 205.0, 203.0, 202.0, 204.0]})
    base, pick, result = _pairs(runner)
    assert len(base) == len(pick) == claim.CLAIM_PAIRS and result.too_wide
    assert result.speedup is None
    steady = FakeRunner({"baseline": [100.0, 102.0, 101.0], "final": [200.0, 203.0, 201.0]})
    base, pick, result = _pairs(steady)
    assert len(pick) == claim.CLAIM_PAIRS and result.speedup == pytest.approx(201.5 / 101.0)
    assert steady.phases == ["baseline", "final", "final", "baseline"]


def test_a_time_limit_spent_leaves_no_claim_and_says_why():
    runner = FakeRunner({"baseline": [100.0], "final": [200.0]}, budget_s=0.0)
    base, pick, result = _pairs(runner)
    assert base == pick == [] and result.speedup is None
    assert "time limit left no room" in result.note and runner.time_limit.reached


def test_under_the_aim_the_claim_has_its_first_pair_and_more_only_within_it():
    """NOTE [ A tune's aim ]: the claim's first pair runs even where the search spent the aim,
    each trial its half of what is left; a claim too wide gets more pairs only within it."""
    loose = {"baseline": [100.0, 101.0, 100.0, 101.0], "final": [200.0, 201.0, 200.0, 201.0]}
    spent = FakeRunner(loose, rate_ci=0.12)
    spent.time_limit.aim(0.0, claim_reserve_s=0.0)
    base, pick, result = _pairs(spent)
    assert len(base) == len(pick) == 1 and result.speedup is None  # +-17%: not claimed
    assert spent.time_limit.aimed and not spent.time_limit.reached
    room = FakeRunner(loose, rate_ci=0.12)
    room.time_limit.aim(60.0, claim_reserve_s=20.0)
    base, pick, result = _pairs(room)
    assert len(pick) == 3 and result.speedup is not None  # as without an aim
    assert room.shares[:2] == [30.0, 30.0]  # the reserve is the claim's: 60 s, half each


def test_a_side_that_slowed_while_tuning_leaves_no_claim_unless_both_slowed_alike():
    # NOTE [ A side that slowed while tuning ]: noisy_worker's pick read 131k samples/s early
    # and 87k in all four end trials, which agreed: 12.78x +-3% claimed, 19.2x in plain loops
    end = claim.end_claim([trial(2, 6800.0, rate_ci=0.03), trial(2, 6900.0, rate_ci=0.03)],
                          [trial(0, 87000.0, rate_ci=0.03), trial(0, 88000.0, rate_ci=0.03)],
                          None)
    assert end.speedup is not None and end.speedup_pct < 5
    pick_early = [trial(0, 131000.0, rate_ci=0.03)]
    pick_drift = claim.drifted(pick_early, end.pick)
    assert pick_drift is not None and pick_drift.change == pytest.approx(87500 / 131000 - 1)
    slowed = claim.slowed(end, pick_drift, None)
    assert slowed.speedup is None and slowed.speedup_pct == pytest.approx(33.2, abs=0.1)
    assert "the pick measured 33% slower" in slowed.note and slowed.ratio == end.ratio
    # both sides slowed alike: the machine's slow minute, the ratio holds
    base_drift = claim.drifted([trial(2, 10300.0, rate_ci=0.03)], end.base)
    assert base_drift is not None and claim.slowed(end, pick_drift, base_drift) == end
    # a side that got faster (a store warming up) is the end's steady state: claimed
    warmed = claim.drifted([trial(2, 3000.0, rate_ci=0.03)], end.base)
    assert warmed is not None and warmed.change > 0 and claim.slowed(end, None, warmed) == end
    assert claim.slowed(end, None, None) == end


# NOTE [ A claim from two processes ] (child/claiming.py)

def test_a_claim_the_two_processes_disagree_on_is_not_made_and_shows_each():
    """The tune's process measured the pick 4x the baseline, a second, fresh one 12x: the
    pairs' spread (+-50%) is the claim's interval, too wide to claim; each process's figures
    are said. Where they agree, the claim stands and says it came from two processes."""
    here = [trial(0, 100.0, rate_ci=0.02), trial(4, 400.0, rate_ci=0.02)]
    there = [trial(0, 33.0, rate_ci=0.02, second_process=True),
             trial(4, 400.0, rate_ci=0.02, second_process=True)]
    result = claim.end_claim([here[0], there[0]], [here[1], there[1]], None)
    assert result.speedup is None and result.speedup_pct > 40
    assert ("in two processes: the pick 400 against 100 (4.00x) in the tune's, 400 against 33 "
            "(12.12x) in a second, fresh one") in result.note
    agreeing = [trial(0, 98.0, rate_ci=0.02, second_process=True),
                trial(4, 395.0, rate_ci=0.02, second_process=True)]
    result = claim.end_claim([here[0], agreeing[0]], [here[1], agreeing[1]], None)
    assert result.speedup == pytest.approx(397.5 / 99.0)
    assert "in two processes" in result.to_dict()["claimed_from"]
    alone = claim.end_claim([here[0]], [here[1]], None)
    assert alone.to_dict()["claimed_from"].endswith("all in the tune's process")


def test_a_second_process_slower_than_the_tune_is_not_drift():
    """Drift compares one process's minutes: a second process's trials differ by process."""
    early = [trial(0, 1000.0, rate_ci=0.02)]
    late = claim.side([trial(0, 1000.0, rate_ci=0.02),
                       trial(0, 600.0, rate_ci=0.02, second_process=True)], None)
    assert claim.drifted(early, late) is None
    late_here = claim.side([trial(0, 600.0, rate_ci=0.02)], None)
    assert claim.drifted(early, late_here) is not None


def test_the_plan_counts_the_second_process_from_the_second_pair():
    from dataloader_tuner.tune import plan

    base = plan.Baseline(0, False, None)
    one = plan.claim_seconds(lambda n: 0.01, 2, base, 0.01, 2.0, pairs=1, second_process_s=3.0)
    assert one == plan.claim_seconds(lambda n: 0.01, 2, base, 0.01, 2.0, pairs=1)
    two = plan.claim_seconds(lambda n: 0.01, 2, base, 0.01, 2.0, pairs=2, second_process_s=3.0)
    assert two == pytest.approx(2 * one + 3.0)


class FakeSecond:
    """SecondProcess's face for the end's pairs: ready or not, its trials marked as its."""

    def __init__(self, runner, ready=True):
        self.runner, self.is_ready, self.asked = runner, ready, []

    def ready(self, pair_s):
        self.asked.append(pair_s)
        return self.is_ready

    def measuring(self, config, phase, share_s=None):
        here = self.runner.measuring(config, phase, share_s)
        return lambda repeat: dataclasses.replace(here(repeat), second_process=True)


def test_every_second_pair_is_measured_in_the_second_process_where_it_is_ready():
    from dataloader_tuner.child.claiming import pairs_at_end
    from dataloader_tuner.tune.recommend import Recommendation
    from dataloader_tuner.tune.tuner import TuneOutcome

    from .test_tuner import limits

    outcome = TuneOutcome([], None, Recommendation({"num_workers": 2}, 1.0, None, ()), limits())
    rates = {"baseline": [100.0, 102.0, 101.0], "final": [200.0, 203.0, 201.0]}
    for ready in (True, False):
        runner = FakeRunner(rates)
        second = FakeSecond(runner, ready)
        base, pick, result = pairs_at_end(runner, LoaderConfig(batch_size=16),
                                          LoaderConfig(batch_size=16, num_workers=2), outcome,
                                          None, second)
        assert len(second.asked) == 1  # asked for the second pair only
        # (not ready: no pair here instead, which could not make a claim)
        assert [t.second_process for t in base] == [False, True][:1 + ready]
        assert [t.second_process for t in pick] == [False, True][:1 + ready]


def test_a_second_process_that_fails_measures_nothing_more_and_is_closed():
    """A pair half from each process would compare the processes: a trial the second process
    fails is not measured here instead; its failure's first line is the claim's reason."""
    from dataloader_tuner.child.claiming import SecondProcess
    from dataloader_tuner.errors import RunError

    class Failing(FakeRunner):
        def measure(self, config, phase, repeat, share_s=None, elsewhere=None):
            raise RunError("The second process measuring the claim died.\nTraceback ...",
                           type="companion_failed")

    runner = Failing({"baseline": [100.0]})
    second = SecondProcess(None, runner, 0.0)
    second.companion = ClosedOnce()
    assert second.measuring(LoaderConfig(batch_size=16), "baseline", None)(1) is None
    assert runner.phases == [] and not second.used  # nothing measured in the tune's process
    assert second.failure == "The second process measuring the claim died."
    assert second.companion is None and ClosedOnce.closed == 1
    assert not second.ready(1.0)  # and not started again


class ClosedOnce:
    closed = 0

    def close(self):
        ClosedOnce.closed += 1


@pytest.mark.host_speed  # sleeps that stand for a process's cost
@pytest.mark.slow  # a real tune with a second process (~30 s)
def test_a_tune_claims_nothing_where_a_second_process_measures_another_ratio(monkeypatch):
    """tests/datasets/process_bound.py: in the tune's process workers speed it up ~4x, in a
    second, fresh one ~3 times that. Measured in one process the tune claimed ~4x +-5%; now
    the second pair comes from a second process, the claim is not made, the figures of each
    are said, and the second process is gone with the tune."""
    from tests.datasets import process_bound

    from .conftest import live_descendants

    monkeypatch.delenv(process_bound.MARKER)  # the tune's child imports it first
    doc = _tuned("process_bound.py")
    baseline = doc["baseline"]
    assert baseline["speedup"] is None, baseline
    assert "in two processes" in baseline["speedup_note"], baseline
    ends = [t for t in doc["trials"] if t["phase"] in ("baseline", "final")]
    assert sorted(t["second_process"] for t in ends) == [False, False, True, True]

    def ratio(second):
        rates = {t["phase"]: t["samples_per_s"] for t in ends if t["second_process"] == second}
        return rates["final"] / rates["baseline"]
    assert ratio(True) > 2 * ratio(False), ends
    assert live_descendants() == []


def test_a_claim_from_the_tune_s_process_only_is_not_made_and_says_why():
    """Without a second process's pair the spread between processes is unknown: audio features
    with a CPU step, one pair in the tune's process, claimed 1.69x +-4% where plain loops in
    fresh processes measured 1.35x."""
    made = claim.end_claim([trial(0, 90.0, rate_ci=0.02)], [trial(2, 152.0, rate_ci=0.02)], None)
    assert made.speedup is not None
    alone = claim.one_process(made, "your time limit left no room for it")
    assert alone.speedup is None and alone.ratio == made.ratio
    assert ("152 samples/s against 90 (1.69x) in the tune's process only (your time limit left "
            "no room for it)") in alone.note
    assert claim.one_process(alone, "again") is alone  # nothing claimed stays so
