"""Every reason and claim the tuner writes agrees with the numbers it quotes.

Each template is rendered from recorded trials and read back: the figures it quotes are the
measured ones, and every comparative ("beats", "within 4%", "cheap to make") holds for them.
"""

import re

import pytest

from dataloader_tuner.tune import costmodel
from dataloader_tuner.tune.recommend import recommend
from dataloader_tuner.child.tuning import no_steady_state_error
from dataloader_tuner.config import LoaderConfig

from .test_tuner import limits, trial

# name -> trials: recorded shapes the templates must describe truthfully
SCENARIOS = {
    # the case: 0 workers picked within the tolerance although 1 worker measured faster
    "main_within_tolerance": [trial(0, 359.0), trial(1, 366.0, worker_ms=1.0, cpu_ms=0.9)],
    "main_beats_workers": [trial(0, 5000.0), trial(1, 2100.0, worker_ms=0.5, cpu_ms=0.5,
                                                     main_cpu_ms=2.0)],
    # the reviewer's case: 0 within the tolerance of the fastest (2 workers), 1 worker slower than both
    "fastest_is_not_the_fewest": [trial(0, 99.0), trial(1, 90.0), trial(2, 100.0)],
    "cpu_bound": [trial(0, 1400.0), trial(1, 1500.0), trial(2, 2900.0), trial(3, 2950.0)],
    "latency_bound": [trial(0, 50.0, cpu_ms=0.5, worker_ms=160.0),
                      trial(1, 50.0, cpu_ms=0.5, worker_ms=160.0),
                      trial(16, 790.0, cpu_ms=0.5, worker_ms=160.0),
                      trial(24, 800.0, cpu_ms=0.5, worker_ms=160.0)],
    # a slow step (178 ms) with cheap batches (1.4 ms): "cheap to make" must quote 1.4 ms
    "slow_step": [trial(0, 16 / 0.1794, idle=0.01, step_ms=178.0, worker_ms=1.4, cpu_ms=1.3),
                  trial(1, 16 / 0.1785, idle=0.0, step_ms=178.0, worker_ms=1.4, cpu_ms=1.3,
                        main_cpu_ms=1.0)],
}


def reasons_for(name):
    trials = SCENARIOS[name]
    has_consumer = any(t.consumer_idle_frac is not None for t in trials)
    one = next(t for t in trials if t.num_workers == 1)
    zero = next(t for t in trials if t.num_workers == 0)
    profile = costmodel.learn(zero, one, 2.0, step_on_cpu=False)
    rec = recommend(trials, profile, limits(), has_consumer, 16)
    return rec, {t.num_workers: t.samples_per_s for t in trials}, profile


def numbers(text):
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_comparatives_agree_with_the_numbers(name):
    rec, rates, profile = reasons_for(name)
    for reason in rec.reasons:
        beats = re.search(r"beats worker processes here \((\d+) samples/s against (\d+) at "
                          r"best, with (\d+)", reason)
        if beats:
            assert float(beats[1]) >= float(beats[2]) == round(max(
                r for n, r in rates.items() if n > 0)), reason
        slower = re.search(r"main process is (\d+)% slower than the fastest worker count "
                           r"\((\d+) samples/s against (\d+) with (\d+)\); within the (\d+)%",
                           reason)
        if slower:
            gap, zero, best, n, allowed = (float(x) for x in slower.groups())
            assert best == round(max(r for k, r in rates.items() if k > 0)) == round(rates[n])
            assert zero < best and abs(gap - 100 * (1 - zero / best)) <= 1 and gap <= allowed
        gave = re.findall(r"(\d+) workers gave (\d+) samples/s", reason)
        for workers, rate in gave:
            assert abs(float(rate) - rates[int(workers)]) < 1, reason
        cheap = re.search(r"cheap to make: ([\d.]+) ms each.*costs the main process ([\d.]+) ms",
                          reason)
        if cheap:
            make, receive = float(cheap[1]), float(cheap[2])
            assert make <= 1.2 * receive + 0.01, reason
            assert make == pytest.approx(profile.make_ms, abs=0.01), reason
        times = re.search(r"That is ([\d.]+)x the (\d+) samples/s of num_workers=0", reason)
        if times:
            assert float(times[2]) == pytest.approx(rates[0], abs=1)
            assert float(times[1]) == pytest.approx(rec.expected_samples_per_s / rates[0],
                                                    abs=0.06)


def test_a_slow_step_is_not_called_a_cheap_batch():
    rec, _, profile = reasons_for("slow_step")
    text = " ".join(rec.reasons)
    assert "178" not in text.split("cheap to make")[-1][:40]  # the step is not the batch cost
    assert profile.make_ms < 5


def test_main_process_within_tolerance_does_not_claim_to_beat_workers():
    rec, _, _ = reasons_for("main_within_tolerance")
    assert rec.kwargs["num_workers"] == 0
    assert not any("beats" in r for r in rec.reasons)
    assert any("2% slower than the fastest worker count (359 samples/s against 366 with 1)" in r
               for r in rec.reasons)


def test_no_steady_state_says_how_many_batches_and_how_long_each_took():
    error = no_steady_state_error(["num_workers=0: 3 batch(es) in 30.1 s, 10.03 s per batch, "
                                   "1 of them warm-up"], LoaderConfig(batch_size=32))
    assert "3 batch(es) in 30.1 s" in error.message and "10.03 s per batch" in error.message
    assert "batch_size = None" in error.message and "\n" not in error.message


def test_the_main_process_is_compared_with_the_fastest_worker_count():
    rec, _, _ = reasons_for("fastest_is_not_the_fewest")
    assert rec.kwargs["num_workers"] == 0
    assert any("(99 samples/s against 100 with 2)" in r for r in rec.reasons), rec.reasons
