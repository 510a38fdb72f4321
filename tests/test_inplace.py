"""Tuning in place: the search's decisions on simulated loops (no loaders), then real ones:
every sample of every epoch exactly once, in the sampler's order, while worker counts change."""

import json
import os
import random
import statistics
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader

from dataloader_tuner import watch
from dataloader_tuner.config import TunedSettings
from dataloader_tuner.tune.in_place import InPlaceSearch

from .clocks import LeapingClock, SimulatedClock
from .conftest import ROOT
from .test_watch import Indices


def searching(start: TunedSettings, max_workers: int, epoch_batches: int | None = None
              ) -> InPlaceSearch:
    """A search on simulated time: ``feed`` moves its clock by each batch's cycle."""
    return InPlaceSearch(start, max_workers, epoch_batches, clock=SimulatedClock())


def feed(search: InPlaceSearch, samples: int, cycle_s: float) -> TunedSettings | None:
    """One batch the loop took ``cycle_s`` for, as the job's clock sees it."""
    search.clock.advance(cycle_s)
    return search.after_batch(samples, cycle_s)


def watch_leaping(loader: DataLoader, **kwargs):
    """``watch`` with the in-place search on a LeapingClock: its prewarm and each trial's time
    cap pass at once, so a few epochs see many switches."""
    from dataloader_tuner.watcher.loader import watch as watch_loader

    return watch_loader(loader, search_clock=LeapingClock(), **kwargs)


def drive(search: InPlaceSearch, rate_of, batch: int = 32, noise: float = 0.01,
          limit: int = 20_000) -> TunedSettings:
    """Feed the search batches whose loop time follows ``rate_of(num_workers)``."""
    rng = random.Random(4)
    for _ in range(limit):
        if search.finished:
            break
        rate = rate_of(search.current.num_workers)
        feed(search, batch, batch / rate * (1 + rng.uniform(-noise, noise)))
    assert search.finished, search.to_dict()
    return search.best.setting


def imagenet_shaped(make_s: float, step_s: float, cores: int):
    """(cycle, wait) of a batch at n workers: batches made in ``make_s`` on a core each."""
    def loop(n: int) -> tuple[float, float]:
        if n == 0:
            return make_s + step_s, make_s
        cycle = max(step_s, 1.03 * make_s / min(n, cores) * (1 + 0.02 * max(n - cores, 0)))
        return cycle, cycle - step_s
    return loop


def latency_bound(n: int) -> tuple[float, float]:
    """Each worker makes 100 samples/s (it waits on storage); the step caps the loop at 700."""
    cycle = 32 / min(100 * max(n, 0.5), 700)
    return cycle, max(cycle - 32 / 700, 0.0)


def test_an_in_memory_loader_goes_down_to_no_workers():
    # Worker processes only add transfer costs: 0 workers is fastest (as tiny_in_memory).
    search = searching(TunedSettings(2), max_workers=8)
    assert drive(search, lambda n: 20_000 / (1 + 0.3 * n)) == TunedSettings(0)
    verdicts = [d.verdict for d in search.decisions]
    assert verdicts[0].startswith("measured as the starting point")
    assert any(v.startswith("rolled back") for v in verdicts)  # 3 workers: worse, left at once
    assert verdicts[-1].startswith("chosen: num_workers=0 after ")


def test_a_latency_bound_loader_climbs_until_the_step_is_fed():
    # Each worker makes 100 samples/s; the step caps the loop at 700: 7 workers feed it.
    search = searching(TunedSettings(0), max_workers=32)
    chosen = drive(search, lambda n: min(100 * max(n, 0.5), 700))
    assert 7 <= chosen.num_workers <= 9  # the first count at the cap on the grow path (1,2,3,4,6,9)
    tried = [t.setting.num_workers for t in search.measured]
    assert tried[:5] == [0, 1, 2, 3, 4] and max(tried) <= 14


def test_one_worker_no_faster_than_none_still_measures_the_count_the_wait_predicts():
    """pytorch/examples' ImageNet loop at the job's 0 workers (issue 62): batches that take
    long to make, a short step, 2 cores. 1 worker makes batches as slowly as the loop did (and
    hands them over), so it measures no faster than 0; the old climb stopped there, at 0,
    where 2 workers make the loop ~2x faster. The loop waited ~98% of its time at 1 worker:
    the count feeding the step is capped at the 2 cores, and it and its neighbour 3 are
    measured (NOTE [ The count the wait predicts ])."""
    loop, cores = imagenet_shaped(0.130, 0.002, 2), 2
    search = InPlaceSearch(TunedSettings(0), 4, clock=SimulatedClock(), cpus=cores)
    rng = random.Random(2)
    while not search.finished:
        cycle, wait = loop(search.current.num_workers)
        jitter = 1 + rng.uniform(-0.01, 0.01)
        search.clock.advance(cycle * jitter)
        search.after_batch(32, cycle * jitter, wait * jitter)
    tried = [t.setting.num_workers for t in search.measured]
    assert tried[:4] == [0, 1, 2, 3], search.to_dict()
    assert search.best.setting == TunedSettings(2)
    one = next(d.verdict for d in search.decisions if d.num_workers == 1)
    assert one.startswith("rolled back to num_workers=0")
    assert "2 workers predicted to feed its step" in one


@pytest.mark.parametrize("start, cpus, loop", [
    (0, 2, imagenet_shaped(0.130, 0.002, 2)),  # pytorch/examples' ImageNet at batch 32
    (0, 2, imagenet_shaped(0.013, 0.001, 2)),  # fast batches: each worker trial to its 4 s cap
    (0, 2, imagenet_shaped(1.3, 0.002, 2)),  # batch 256: 30 s trials
    (0, 16, imagenet_shaped(0.130, 0.010, 16)),  # 16 cores: the prediction jumps to 14
    (0, 32, latency_bound),
    (6, 8, lambda n: (32 / (1000.0 if n >= 3 else 350.0 * max(n, 1)),
                      (0.01 if n >= 3 else 0.5) * 32 / (1000.0 if n >= 3 else 350.0 * max(n, 1)))),
])
def test_the_search_takes_the_time_it_says(start, cpus, loop):
    """Said once the first setting is measured (NOTE [ The time an in-place search says ]),
    within 40% of the time the search then takes, and once the count to measure is
    predicted, within 25%; the choice's line holds them. Workers hand batches in bursts, as
    real ones do (a cycle 0.5x or 1.5x the mean). Read off the median seconds of the settings
    measured so far, it said 1.2-2.3x the time taken."""
    search = InPlaceSearch(TunedSettings(start), 4 if cpus == 2 else 32, clock=SimulatedClock(),
                           cpus=cpus)
    rng = random.Random(2)
    while not search.finished:
        cycle, wait = loop(search.current.num_workers)
        jitter = rng.choice((0.5, 1.5)) if search.current.num_workers else 1.0
        search.clock.advance(cycle * jitter)
        search.after_batch(32, cycle * jitter, wait * jitter)
    said, took = search.time.announced_s, search.to_dict()["took_s"]
    assert "the search needs ~" in search.decisions[0].verdict
    assert 0.6 <= took / said <= 1.4, (said, took, search.to_dict()["decisions"])
    last = search.time.estimated_s
    assert 0.75 <= took / last <= 1.25, (last, took, search.to_dict()["decisions"])
    assert ", said ~" in search.decisions[-1].verdict


def bursty(search: InPlaceSearch, rates: dict[int, float], noisy: set[int], seed: int
           ) -> InPlaceSearch:
    """Drive ``search`` to its choice: counts in ``noisy`` hand batches in bursts (a cycle
    0.3x or 1.7x the mean, as workers handing two at once), the others evenly."""
    rng = random.Random(seed)
    while not search.finished:
        n = search.current.num_workers
        cycle = 32 / rates[n] * (rng.choice((0.3, 1.7)) if n in noisy else 1.0)
        search.clock.advance(cycle)
        search.after_batch(32, cycle, 0.5 * cycle)
    return search


def test_more_workers_are_not_kept_on_a_gain_within_the_noise():
    """2, 3 and 4 workers equally fast (2 cores saturated), 3 and 4 in bursts: a 4 s trial
    of theirs reads up to ~10% off, and the old rule (any gain >= 3%) kept 3 on it (seed 0).
    Within the two rates' uncertainty the more workers are measured on, and
    kept only where they still gain beyond it."""
    rates = {n: 800.0 if n < 2 else 1000.0 for n in range(5)}
    for seed in range(8):
        search = bursty(InPlaceSearch(TunedSettings(2), 4, clock=SimulatedClock(), cpus=2),
                        rates, noisy={3, 4}, seed=seed)
        assert search.best.setting == TunedSettings(2), (seed, search.to_dict())


def test_a_best_whose_rate_is_the_looser_is_measured_again_before_a_close_call():
    """2 workers in bursts (its rate known to ~±12% after 4 s), 3 workers even and 8% faster:
    the gain is within the noise of 2's rate, so 2 is measured again, then 3 is judged."""
    rates = {0: 500.0, 1: 600.0, 2: 1000.0, 3: 1080.0, 4: 1080.0}
    search = bursty(InPlaceSearch(TunedSettings(2), 4, clock=SimulatedClock(), cpus=2),
                    rates, noisy={2}, seed=1)
    again = [d for d in search.decisions if "measured again to tell" in d.verdict]
    assert [d.num_workers for d in again] == [3], search.to_dict()
    assert search.best.setting == TunedSettings(3)
    two = next(t for t in search.measured if t.setting == TunedSettings(2))
    assert two.interval() < 0.06 and abs(two.samples_per_s / 1000 - 1) < 0.06


def test_a_fed_loop_predicts_its_own_count_and_steps_down_from_it():
    """A job of 6 workers whose loop hardly waits: 6 feed its step already, so the search
    measures 7 and 5 beside it and goes down while fewer lose nothing."""
    search = InPlaceSearch(TunedSettings(6), 8, clock=SimulatedClock(), cpus=8)
    rate = {n: 1000.0 if n >= 3 else 350.0 * max(n, 1) for n in range(9)}
    while not search.finished:
        cycle = 32 / rate[search.current.num_workers]
        search.clock.advance(cycle)
        search.after_batch(32, cycle, 0.01 * cycle if search.current.num_workers >= 3 else
                           0.5 * cycle)
    tried = [t.setting.num_workers for t in search.measured]
    assert tried[:3] == [6, 7, 5] and search.predicted == 6
    assert search.best.setting == TunedSettings(3)


def test_fewer_workers_within_tolerance_are_preferred():
    search = searching(TunedSettings(6), max_workers=8)
    assert drive(search, lambda n: 1000 if n >= 2 else 400).num_workers == 2


def drive_epochs(search: InPlaceSearch, cycle_of, startup_of, epoch_batches: int) -> TunedSettings:
    """Like ``drive``, with each epoch (and each switch) starting the loader anew: its first
    batch's cycle carries the setting's start-up."""
    taken = 0
    search.loader_started()
    for _ in range(20_000):
        if search.finished:
            break
        n = search.current.num_workers
        fresh = search.trial.fresh
        switch = feed(search, 32, cycle_of(n) + (startup_of(n) if fresh else 0.0))
        taken += 1
        if switch is not None or taken % epoch_batches == 0:
            search.loader_started()
    assert search.finished, search.to_dict()
    return search.best.setting


def test_each_setting_is_charged_its_start_up_as_the_job_pays_it():
    """2 workers make batches 20% faster than none, but restarting them costs 1 s at each of
    the job's 50-batch epochs: 1.5 s an epoch against 0.6 s. Uncharged, the steady rate alone
    would keep them."""
    def cycle(n):
        return 0.010 if n else 0.012

    def startup(n):
        return 1.0 if n else 0.0

    charged = searching(TunedSettings(0), max_workers=2, epoch_batches=50)
    assert drive_epochs(charged, cycle, startup, 50) == TunedSettings(0)
    tried = {t.setting.num_workers: t for t in charged.measured}
    # (0 workers: no start-up, or none seen: its first batches fell in the job's PREWARM_S)
    assert tried[1].startup_s() == pytest.approx(1.0) and tried[0].startup_s() in (0.0, None)
    assert tried[1].to_dict()["startup_ms"] == pytest.approx(1000.0)
    kept = searching(TunedSettings(0), max_workers=2)  # persistent workers: paid once, not charged
    assert drive_epochs(kept, cycle, startup, 50).num_workers > 0


def test_a_failing_setting_is_dropped_for_the_best_so_far():
    search = searching(TunedSettings(2), max_workers=8)
    rng = random.Random(1)
    while search.current == TunedSettings(2):
        feed(search, 32, 0.01 * (1 + rng.uniform(-0.01, 0.01)))
    trying = search.current
    assert trying.num_workers == 3
    assert search.setting_failed(trying, "worker killed") == TunedSettings(2)
    assert search.finished and search.current == TunedSettings(2)
    assert "failed and dropped (worker killed)" in search.decisions[-1].verdict


def indices_loader(workers: int) -> DataLoader:
    return DataLoader(Indices(240), batch_size=4, shuffle=True, num_workers=workers,
                      generator=torch.Generator().manual_seed(11))


def test_switching_in_place_keeps_every_epoch_whole_and_in_order(db_path, tmp_path,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    watched = watch_leaping(indices_loader(1), name="tuned", db=db_path, tune=True,
                            max_workers=3)
    seen = [[int(i) for b in watched for i in b.flatten()] for _ in range(3)]
    watched.close()
    assert seen == seen_unwatched(3)  # the same samples, in the same order, every epoch
    assert len({s.num_workers for s in [t.setting for t in watched.search.measured]}) >= 2
    assert watched.search.finished
    assert (tmp_path / "dataloader-tuner-tuned.json").exists()


def seen_unwatched(epochs: int) -> list[list[int]]:
    loader = indices_loader(1)
    return [[int(i) for b in loader for i in b.flatten()] for _ in range(epochs)]


def tune_in_place(loader: DataLoader, step_s: float, db: str, max_workers: int,
                  epochs: int = 40) -> tuple[int, list[list[int]], list[str]]:
    """A training loop (a sleep for a step) tuning ``loader`` in place: the chosen worker
    count, per epoch the sample indices the loop received, and the search's log."""
    watched = watch(loader, name="in-place", db=db, tune=True, max_workers=max_workers)
    seen = []
    for _ in range(epochs):
        indices = []
        for _images, labels in watched:
            indices += labels.tolist()
            time.sleep(step_s)
        seen.append(indices)
        if watched.search.finished:
            break
    watched.close()
    return (watched.search.best.setting.num_workers, seen,
            [d.verdict for d in watched.search.decisions])


def offline_pick(target: str, step_ms: float, db: str, max_workers: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "dataloader_tuner", "tune", target, "--step-ms", str(step_ms),
         "--max-workers", str(max_workers), "--budget-s", "40", "--json", "--db", db],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class Labelled(torch.utils.data.Dataset):
    """Wraps a demo dataset so each sample's label is its index: the loop can check them."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        return self.inner[index][0], index


@pytest.mark.slow
@pytest.mark.parametrize("target, step_ms, start, max_workers", [
    ("examples/latency_bound.py:RemoteStorageDataset(length=1600, latency_s=0.004)", 8.0, 0, 12),
    ("examples/tiny_in_memory.py", 0.0, 2, 4),
])
@pytest.mark.host_speed
def test_in_place_converges_to_the_offline_pick(db_path, tmp_path, monkeypatch, target,
                                                 step_ms, start, max_workers):
    monkeypatch.chdir(tmp_path)
    from dataloader_tuner.child.target import resolve

    resolved = resolve(os.path.join(ROOT, target))
    dataset = Labelled(resolved.dataset)
    loader = DataLoader(dataset, batch_size=resolved.batch_size, shuffle=True,
                        num_workers=start)
    chosen, seen, _ = tune_in_place(loader, step_ms / 1000, db_path, max_workers)
    for epoch in seen[:-1]:  # every finished epoch: each sample exactly once
        assert sorted(epoch) == list(range(len(dataset)))
    tuned = offline_pick(os.path.join(ROOT, target), step_ms, db_path, max_workers)
    offline = tuned["recommended"]["num_workers"]
    # The same rule on the same loop: the same count, or its neighbour on the climb's path
    # where two counts are within the noise of each other; or, on a plateau (a step that 4
    # workers already feed: the offline tuner's "fed" rule may go on to 12), a count the
    # offline search itself measured at the rate of its pick.
    path = sorted({0, 1, 2, 3, 4, 6, 9, 13, offline, chosen})
    rates = {t["num_workers"]: t["samples_per_s"] for t in tuned["trials"]
             if t["phase"] not in ("prewarm", "baseline", "final") and t["samples_per_s"]}
    on_plateau = (chosen in rates and offline in rates
                  and rates[chosen] >= 0.95 * rates[offline])
    if abs(path.index(chosen) - path.index(offline)) <= 1 or on_plateau:
        return
    # Further apart (seen: 4 in place, 8 offline, on a plateau the offline search never
    # measured at 4): the loop's own clock decides whether the in-place pick is within 5% of
    # the offline one, the best of two epochs each, in turns, workers restarting each epoch as
    # this job's do (the in-place search charges that restart; the offline trials do not).
    own = {n: [] for n in (chosen, offline)}
    for _ in range(2):
        for n in own:
            own[n].append(epoch_rate(dataset, resolved.batch_size, n, step_ms / 1000))
    assert max(own[chosen]) >= 0.95 * max(own[offline]), (chosen, offline, rates, own)


class CpuBoundSamples(torch.utils.data.Dataset):
    """Each sample costs ~1 ms of pure-Python CPU work (a decode's stand-in) and is labelled
    with its index: 1 worker makes batches as slowly as the loop does, 2 on 2 cores twice as
    fast."""

    def __len__(self) -> int:
        return 1536

    def __getitem__(self, index: int):
        acc = 0
        for i in range(12_000):
            acc += (i * index) % 7
        return torch.full((16,), float(acc % 5)), index


@pytest.mark.slow  # a real job tuning in place: ~40 s, then 15 plain epochs to judge it
@pytest.mark.host_speed
def test_in_place_from_no_workers_reaches_the_count_its_wait_predicts(db_path, tmp_path,
                                                                      monkeypatch):
    """pytorch/examples' ImageNet loop's shape (issue 62): CPU-bound batches, a short step, the
    job's num_workers=0. 1 worker is no faster than none; the search measures the count the
    loop's wait predicts anyway (NOTE [ The count the wait predicts ]), and what it keeps
    fills the cores, as the best of plain epochs of 0-4 workers (timed by the loop's own
    clock) does; the search says its time, and at the end how long it took."""
    monkeypatch.chdir(tmp_path)
    dataset, step_s = CpuBoundSamples(), 0.001
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=0)
    chosen, seen, log = tune_in_place(loader, step_s, db_path, max_workers=4, epochs=60)
    assert "the search needs ~" in log[0] and ", said ~" in log[-1], log
    for epoch in seen[:-1]:
        assert sorted(epoch) == list(range(len(dataset)))
    cores = os.cpu_count() or 1
    if cores < 2:
        pytest.skip("needs 2 cores for 2 workers to pay")
    plain = {n: [] for n in range(5)}
    # In turns, so the machine's drift cancels; each count's median, as one fast epoch of a
    # count the noise favoured is no best (CI once read 3 workers 1489 then 1745 samples/s).
    for order in (range(5), reversed(range(5)), range(5)):
        for n in order:
            plain[n].append(epoch_rate(dataset, 32, n, step_s))
    medians = {n: statistics.median(rates) for n, rates in plain.items()}
    # 2-4 workers fill the 2 cores alike: which of them wins a turn is the machine's noise
    # here (a count's own plain epochs spread ±13%; its median over three turns moved 5-20%
    # between runs, 2 workers' 0.83-1.0 of 3's), so any of them is right, within that
    # spread of the best. Stopping at 0 or 1 reads 0.5-0.74 of it: the bound lies between
    # (0.85 lay inside the right counts' spread).
    best = max(medians.values())
    assert chosen >= 2 and medians[chosen] >= 0.78 * best, (chosen, plain)


def epoch_rate(dataset, batch_size: int, workers: int, step_s: float) -> float:
    """Samples per second of one epoch of a loop that sleeps ``step_s`` a batch, as the loop
    times it (its workers' start included)."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)
    started, samples = time.monotonic(), 0
    for _images, labels in loader:
        samples += len(labels)
        time.sleep(step_s)
    return samples / (time.monotonic() - started)


def fail_in_third_worker(worker_id: int) -> None:
    if worker_id >= 2:
        raise RuntimeError("this job's workers cannot open a third connection")


def test_a_failing_setting_falls_back_without_stopping_training(db_path, tmp_path, monkeypatch,
                                                               capfd):
    monkeypatch.chdir(tmp_path)


    def loader():
        return DataLoader(Indices(240), batch_size=4, shuffle=True, num_workers=2,
                          worker_init_fn=fail_in_third_worker,
                          generator=torch.Generator().manual_seed(3))

    watched = watch_leaping(loader(), name="fragile", db=db_path, tune=True, max_workers=4)
    seen = [[int(i) for b in watched for i in b.flatten()] for _ in range(2)]
    watched.close()
    unwatched = loader()
    assert seen == [[int(i) for b in unwatched for i in b.flatten()] for _ in range(2)]
    assert TunedSettings(3) in watched.search.failed
    assert watched.search.best.setting.num_workers < 3
    assert "failed and dropped" in capfd.readouterr().err


def test_a_setting_that_cannot_start_falls_back_too(db_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from dataloader_tuner.watcher.in_place_tuning import TunedEpoch

    real_segment = TunedEpoch._segment

    def segment(self, setting):
        if setting.num_workers == 2:
            raise OSError("Too many open files")
        return real_segment(self, setting)

    monkeypatch.setattr(TunedEpoch, "_segment", segment)
    watched = watch_leaping(indices_loader(1), name="no-fds", db=db_path, tune=True,
                            max_workers=3)
    seen = [[int(i) for b in watched for i in b.flatten()] for _ in range(2)]
    watched.close()
    assert seen == seen_unwatched(2)
    assert TunedSettings(2) in watched.search.failed


class BadSample(Indices):
    def __getitem__(self, index: int):
        if index == 77:
            raise ValueError("corrupt sample 77")
        return super().__getitem__(index)


def test_a_bad_sample_ends_in_the_job_s_own_error_not_a_loop(db_path, tmp_path, monkeypatch):
    """Every setting fails on it: each is dropped once, then the job's own raises, as it
    would unwatched."""
    monkeypatch.chdir(tmp_path)
    watched = watch_leaping(DataLoader(BadSample(240), batch_size=4, num_workers=1),
                            name="bad", db=db_path, tune=True, max_workers=3)
    with pytest.raises(Exception, match="corrupt sample 77"):
        for _ in range(3):
            for _batch in watched:
                pass
    watched.close()
    assert len(watched.search.failed) <= 3


def test_loaders_that_cannot_be_planned_are_watched_untuned(db_path):
    from torch.utils.data import Sampler

    class Endless(Sampler):
        def __iter__(self):
            while True:
                yield [0, 1]

    endless = watch(DataLoader(Indices(8), batch_sampler=Endless()), db=db_path, tune=True)
    assert endless.search is None and "no length" in endless.tune_off_because
    endless.close()
    if "in_order" in DataLoader.__init__.__code__.co_varnames:
        unordered = watch(DataLoader(Indices(8), batch_size=2, num_workers=1, in_order=False),
                          db=db_path, tune=True)
        assert unordered.search is None and "in_order=False" in unordered.tune_off_because
        unordered.close()


def test_the_best_failing_while_another_setting_is_tried_falls_back_to_the_measured_own():
    """A node's follower reports that the node's best failed while the leader tries another
    count: the search goes on against the job's own, measured, instead of a rate it lacks."""
    search = searching(TunedSettings(1), max_workers=8)
    rates = {1: 500.0, 2: 1000.0, 3: 1100.0, 4: 1150.0}
    while search.best is None or search.best.setting != TunedSettings(2):
        feed(search, 32, 32 / rates[search.current.num_workers])
    assert search.current == TunedSettings(3)
    search.setting_failed(TunedSettings(2), "worker killed on rank 1")
    assert search.best is not None and search.best.setting == TunedSettings(1)
    assert search.best.samples_per_s is not None
    for _ in range(5000):  # the trial of 3 is judged against 1's rate: no crash
        if search.finished:
            break
        feed(search, 32, 32 / rates.get(search.current.num_workers, 1000.0))
    assert search.finished and search.best.setting != TunedSettings(2)
