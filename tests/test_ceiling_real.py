"""The ceiling and a what-if against plain loops (issue: "the stated ceiling on a CPU-bound
fixture agrees within 15% with the best of a plain grid of worker counts"; "the predicted gain
of removing [a stage] agrees within 15% with a measurement of the same dataset with that stage
removed"). known_stages: 1 ms of CPU a sample in three named functions, decode_sample half
of it."""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import types

import pytest
import torch

from dataloader_tuner.child.cached import cached_samples, measure_cached
from dataloader_tuner.child.target import resolve
from dataloader_tuner.child.trial_run import TrialRunner
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.record.cards import Consumer
from dataloader_tuner.tune.time_limit import TimeLimit
from dataloader_tuner.tune.recommend import uncertainty_pct
from tests.real.plain_loop import plain_rate

from .conftest import ROOT

from .conftest import dataset_path
from .test_cli import cli

pytestmark = [pytest.mark.slow,  # a tune (~12 s) and two plain grids (~30 s each)
              pytest.mark.host_speed]  # the tool and plain loops timed apart

AGREE = 0.15
GRID = (0, 1, 2, 3, 4)
SECONDS = 2.5


def grids_best(monkeypatch, skips: tuple[str, ...]) -> list[float]:
    """The best samples/s of plain loops over GRID (persistent workers, as the pick) for
    each of ``skips`` (KNOWN_STAGES_SKIP), the loops of one worker count side by side in turns
    (their order alternating) so that the machine's slow drifts fall on each alike: a CI run's
    grids taken one after the other read a gain of 1.81 where decode_sample's share (0.37-0.38
    here) allows ~1.6."""
    rates: list[list[float]] = [[] for _ in skips]
    for turn, n in enumerate(GRID):
        order = range(len(skips)) if turn % 2 == 0 else reversed(range(len(skips)))
        for i in order:
            monkeypatch.setenv("KNOWN_STAGES_SKIP", skips[i])
            rates[i].append(plain_rate(dataset_path("known_stages.py"), SECONDS, num_workers=n,
                                       **({"persistent_workers": True} if n else {})
                                       )["samples_per_s"])
    return [max(each) for each in rates]


def test_the_ceiling_and_a_stage_removed_agree_with_plain_grids(tmp_path, monkeypatch):
    monkeypatch.delenv("KNOWN_STAGES_SKIP", raising=False)
    done = cli("tune", dataset_path("known_stages.py"), "--json", db=str(tmp_path / "runs.db"))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    ceiling = doc["ceiling"]
    assert ceiling["binding"] == "cpu", ceiling  # 2 CPUs spinning
    best, without = grids_best(monkeypatch, ("", "decode_sample"))
    # (on failure: each trial's CPU a batch, which the cpu limit reads, and the budget)
    cpu_read = [(t["phase"], t["num_workers"], round(t["worker_cpu_ms"] or 0, 2),
                 round(t["main_cpu_ms"] or 0, 2), round(t["samples_per_s"])) for t in doc["trials"]]
    assert ceiling["samples_per_s"] == pytest.approx(best, rel=AGREE), (
        ceiling["limits"], ceiling["sentence"], best, cpu_read)

    gone = next(w for w in doc["what_if"] if w["change"] == "decode_sample gone")
    measured_gain = without / best
    predicted = gone["predicted_samples_per_s"] / ceiling["samples_per_s"]
    shares = {h["function"]: h["total_share"]
              for h in (doc.get("stacks") or {}).get("hotspots", ())[:5]}
    print(f"ceiling {ceiling['samples_per_s']:.0f} vs plain {best:.0f}; gone {predicted:.3f} "
          f"vs plain {measured_gain:.3f}; shares {shares}")
    assert predicted == pytest.approx(measured_gain, rel=AGREE), (
        gone, without, best, measured_gain)
    # and no fix for a stage the profile did not find: only the functions it saw (its
    # __getitem__ too where it holds under ALL_OF_IT of the loader: 0.88-0.90 here)
    named = {w["function"] for w in doc["what_if"] if w["function"]}
    assert named <= {"decode_sample", "augment", "read_bytes", "_spin",
                     "KnownStages.__getitem__"}, named

    # the cache measured at the tune's end: far above the pick, the spins being most of a sample
    (cache,) = [w for w in doc["what_if"] if w["measured_samples_per_s"] is not None]
    assert cache["change"].startswith("every sample cached in RAM")
    assert cache["measured_samples_per_s"] > 2 * best and cache["predicted_samples_per_s"]


def test_the_cache_s_rate_agrees_with_a_plain_loop_over_the_same_held_samples(monkeypatch):
    """ImageFolder + Compose (tests/real/imagefolder_compose.py): its first samples held, the
    cached trials (child/cached.py) and plain loops over the same samples, in turns in this
    process: within the trials' stated interval, or 15% where they state less, in the median
    of 5 rounds (a CI run under load read one round's trials at 4,008 and 1,620 against a plain
    loop's 8,646, the next round's 8,573 and 9,060 against 8,717). A round's ratio moves
    0.84-1.29 even here, unloaded (the host's speed between seconds): CI's median of 3 read
    1.215 (1.29, 1.22, 0.84)."""
    from dataloader_tuner.child import cached

    # (every image held however slow the host: loaded, the 5 s of making them held 1,008)
    monkeypatch.setattr(cached, "GATHER_S", 60.0)
    resolved = resolve(os.path.join(ROOT, "tests", "real", "imagefolder_compose.py"))
    config = LoaderConfig(batch_size=32, num_workers=2, persistent_workers=True)
    runner = TrialRunner(resolved, Consumer(), lambda t: None, TimeLimit(None))
    ratios, stated_each = [], []
    for _ in range(5):
        found = measure_cached(runner, config)
        assert found is not None
        trials, held = found
        module = types.ModuleType("held_samples")
        module.dataset, module.batch_size = cached_samples(resolved.dataset, 32), 32
        plain = plain_rate(module, SECONDS, num_workers=2,
                           persistent_workers=True)["samples_per_s"]
        ratios.append(statistics.fmean(t.samples_per_s for t in trials) / plain)
        stated_each.append(max(uncertainty_pct(trials) or 0.0, 100 * AGREE) / 100)
    assert held == 1024  # every image (150 KB each, under the 256 MB held at most)
    stated = statistics.median(stated_each)
    assert statistics.median(ratios) == pytest.approx(1.0, abs=stated), (ratios, stated_each)


class ThreadedInTest(torch.utils.data.Dataset):
    """The test's own threaded fetch, written apart from the tool's (child/io_threads.py): a
    pool per process, a batch's samples mapped over it in order."""

    def __init__(self, inner, threads: int) -> None:
        self.inner, self.threads, self.pool, self.pid = inner, threads, None, None

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        return self.inner[index]

    def __getitems__(self, indices):
        if self.pid != os.getpid():
            self.pool = concurrent.futures.ThreadPoolExecutor(self.threads)
            self.pid = os.getpid()
        return list(self.pool.map(self.inner.__getitem__, indices))


def test_threads_for_waiting_reads_are_measured_and_agree_with_a_plain_loop(tmp_path):
    """A loader that waits 5 ms a sample (tests/datasets/remote_reads.py), held to 2 workers:
    the tune measures its pick with threads fetching, beside the cost model's prediction; a
    plain loop with the test's own threads agrees with the measurement within 15%, and the
    overlap fix says measured."""
    done = cli("tune", dataset_path("remote_reads.py"), "--max-workers", "2", "--json",
               db=str(tmp_path / "runs.db"))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    row = next(w for w in doc["what_if"] if "threads fetching each batch" in w["change"])
    threads = int(row["change"].split()[0])
    assert row["change"].endswith("in each worker (measured)") and 2 <= threads <= 8
    pick = doc["ceiling"]["measured_samples_per_s"]
    assert row["measured_samples_per_s"] > 2 * pick  # the waits overlap
    assert row["predicted_samples_per_s"] == pytest.approx(row["measured_samples_per_s"],
                                                           rel=0.25), row
    module = types.ModuleType("threaded_reads")
    module.dataset = ThreadedInTest(resolve(dataset_path("remote_reads.py")).dataset, threads)
    module.batch_size = 8
    plain = statistics.median(
        plain_rate(module, SECONDS, num_workers=2)["samples_per_s"] for _ in range(2))
    assert row["measured_samples_per_s"] == pytest.approx(plain, rel=AGREE), (row, plain)
    overlap = next(f for f in doc["fixes"] if f["fix"] == "overlap the waits for storage")
    assert overlap["measured_samples_per_s"] == row["measured_samples_per_s"]
