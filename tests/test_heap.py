"""Memory a worker frees (instrument/heap.py) and the search's decision on it
(tune/heap_check.py): the worker_init_fn in configs, snippets, settings files and the page, the
page faults it saves in a real DataLoader worker, and the decision on simulated trials."""

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
from torch.utils.data import DataLoader

from dataloader_tuner import KeepFreedMemory, LimitThreads, LoaderConfig, load_settings
from dataloader_tuner.dashboard.jobs import controls_from_settings, settings_from_controls
from dataloader_tuner.errors import ConfigError
from dataloader_tuner.instrument import heap
from dataloader_tuner.settings import read_settings, recommended_config, tuned_values
from dataloader_tuner.tune.same_settings import same_settings
from dataloader_tuner.tune.heap_check import FRESH_PHASE, HeapDecision
from dataloader_tuner.tune.recommend import Recommendation

from .test_tuner import trial

glibc = pytest.mark.skipif(not heap.is_glibc(), reason="glibc's malloc thresholds only")


def init(worker_id):
    """A user's own worker_init_fn."""
    init.seen.append(worker_id)


init.seen = []


def test_the_worker_init_fn_runs_yours_first_and_keeps_its_name():
    keep = KeepFreedMemory(init)
    keep(3)
    assert init.seen[-1] == 3
    assert repr(keep) == "KeepFreedMemory(init)" and repr(KeepFreedMemory()) == "KeepFreedMemory()"
    assert heap.keeps_freed_memory(LimitThreads(keep)) and not heap.keeps_freed_memory(init)


def test_the_setting_in_configs_snippets_settings_files_and_the_page(tmp_path):
    config = LoaderConfig(batch_size=8, num_workers=2, worker_init_fn=init, keep_freed_memory=True)
    assert "keep_freed_memory" not in config.to_kwargs()  # not DataLoader's
    assert config.snippet().endswith("worker_init_fn=dataloader_tuner.KeepFreedMemory(init))")
    both = config.replace(worker_threads=1).snippet()
    assert both.endswith("dataloader_tuner.LimitThreads(dataloader_tuner.KeepFreedMemory(init)))")
    assert config.to_json_dict()["keep_freed_memory"] is True
    assert config.replace(num_workers=0).keep_freed_memory is False
    with pytest.raises(ConfigError, match="keep_freed_memory only applies with worker"):
        LoaderConfig(keep_freed_memory=True)
    assert not same_settings(config, config.replace(keep_freed_memory=False))
    assert same_settings(config, config.replace(keep_freed_memory=False,
                                                worker_init_fn=KeepFreedMemory(init)))
    values = tuned_values({"num_workers": 2, "keep_freed_memory": True})
    assert recommended_config(LoaderConfig(batch_size=8), values).keep_freed_memory
    assert not tuned_values({"num_workers": 0, "keep_freed_memory": True})["keep_freed_memory"]

    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"dataloader_kwargs": {
        "num_workers": 2, "keep_freed_memory": True, "worker_threads": 1}}))
    assert read_settings(str(path))["keep_freed_memory"] is True  # as the CLI sends it
    kwargs = load_settings(str(path), worker_init_fn=init)
    assert "keep_freed_memory" not in kwargs and "worker_threads" not in kwargs
    outer = kwargs["worker_init_fn"]
    assert isinstance(outer, LimitThreads) and isinstance(outer.init_fn, KeepFreedMemory)
    assert outer.init_fn.init_fn is init
    DataLoader(list(range(4)), batch_size=2, **kwargs)  # DataLoader takes them as they are

    controls = {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2,
                "persistent_workers": False, "batch_size": 8,
                **controls_from_settings({"num_workers": 2, "keep_freed_memory": True})}
    assert controls["keep_freed"] is True
    assert settings_from_controls(controls)["keep_freed_memory"] is True
    assert "keep_freed_memory" not in settings_from_controls({**controls, "keep_freed": False})


# A fresh interpreter (its heap has freed nothing large, as a training script's before its
# first epoch) runs one worker over items that hold eight 1 MB arrays at once, then free them:
# each item returns the page faults its allocations took in the worker.
FAULTS_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from torch.utils.data import DataLoader, Dataset
    from dataloader_tuner import KeepFreedMemory
    from dataloader_tuner.instrument.heap import FaultsSinceFirstBatch

    class Arrays(Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, index):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            arrays = [np.ones(128 * 1024) for _ in range(8)]  # 8 MB held, then freed
            sum(a.sum() for a in arrays)
            del arrays
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    keep = sys.argv[1] == "keep"
    loader = DataLoader(Arrays(), batch_size=None, num_workers=1, persistent_workers=True,
                        worker_init_fn=KeepFreedMemory() if keep else None)
    counted = FaultsSinceFirstBatch()  # as a tune's trial counts them, from outside
    faults = []
    for item in loader:
        if not faults:
            counted.start(loader._iterator._workers[0].pid)
        faults.append(int(item))
    print(json.dumps([sorted(faults[5:])[len(faults[5:]) // 2],
                      counted.per_batch(len(faults) - 1)]))
""")


def _median_faults(mode: str) -> list[float]:
    """[the median item's faults as its worker read them, the counter's per item]."""
    done = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT, mode], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc
@pytest.mark.slow  # real workers in turns, 3-4 s
def test_a_worker_that_keeps_freed_memory_stops_faulting_it_in_again():
    (given_back, counted_back), (kept, counted_kept) = _median_faults("none"), _median_faults("keep")
    # 8 x 1 MB = 2,048 pages zeroed again each item when given back
    assert given_back >= 1000, given_back
    assert kept <= given_back / 20, (kept, given_back)
    # read from outside the worker (/proc), as the tune's freed-memory check reads them
    assert counted_back >= 0.8 * given_back, (counted_back, given_back)
    assert counted_kept <= counted_back / 10, (counted_kept, counted_back)


def _search_trial(n, rate, keep=True, rate_ci=0.03, **kw):
    return trial(n, rate, rate_ci=rate_ci, keep_freed_memory=keep, **kw)


def test_the_search_keeps_it_where_fresh_workers_were_slower_beyond_noise():
    decision = HeapDecision(available=True)
    assert decision.first_keeps  # undecided: the first trial with workers runs with it
    ran, shown = [], []

    def fresh():
        ran.append(1)
        return _search_trial(1, 160.0, keep=False)

    serial = _search_trial(0, 150.0, keep=False)
    assert decision.check(serial, fresh, shown.append) is serial and not ran
    first = _search_trial(1, 240.0)
    assert decision.check(first, fresh, shown.append) is first
    assert ran == [1] and decision.keep and decision.first_keeps
    assert [t.phase for t in shown] == [FRESH_PHASE]
    assert "KeepFreedMemory(): each worker keeps" in decision.reason
    assert "240 samples/s with it against 160 in workers started fresh" in decision.reason
    later = _search_trial(2, 300.0)
    assert decision.check(later, fresh, shown.append) is later and ran == [1]  # once

    rec = Recommendation({"num_workers": 2}, 300.0, 3.0, ("2 workers",))
    kept = decision.recommend(rec, [later])
    assert kept.kwargs["keep_freed_memory"] is True and decision.reason in kept.reasons
    no_workers = Recommendation({"num_workers": 0}, 150.0, 3.0, ("0 workers",))
    assert decision.recommend(no_workers, [serial]) == no_workers


def test_no_gain_beyond_noise_and_no_fresh_workers_keep_nothing():
    same = HeapDecision(available=True)
    same.check(_search_trial(1, 240.0), lambda: _search_trial(1, 236.0, keep=False),
               lambda t: None)
    assert same.decided and not same.keep and not same.first_keeps and same.reason is None
    rec = Recommendation({"num_workers": 1}, 240.0, 3.0, ("1 worker",))
    assert same.recommend(rec, [_search_trial(1, 240.0)]) == rec

    def unpicklable():
        raise RuntimeError("Can't pickle local object")

    failed = HeapDecision(available=True)
    first = _search_trial(1, 240.0)
    assert failed.check(first, unpicklable, lambda t: None) is first
    assert failed.decided and not failed.keep and not failed.others

    elsewhere = HeapDecision(available=False)  # not glibc: never tried
    assert not elsewhere.first_keeps
    assert elsewhere.check(first, unpicklable, lambda t: None) is first and not elsewhere.decided


def test_fresh_workers_faulting_pages_in_keep_it_where_their_rates_were_too_noisy():
    """A rate read once a side, ±20-30% between processes on a busy machine, cannot tell
    audio_mel's fresh workers from kept ones; their page faults can (NOTE [ Deciding freed
    memory during the search ])."""
    def side(rate, faults, keep):
        return _search_trial(1, rate, keep=keep, rate_ci=0.25, worker_ms=560.0,
                             worker_faults=faults)

    noisy = HeapDecision(available=True)  # the rates alone: not told apart
    noisy.check(side(400.0, None, True), lambda: side(300.0, None, False), lambda t: None)
    assert noisy.decided and not noisy.keep
    faulting = HeapDecision(available=True)
    faulting.check(side(400.0, 720.0, True), lambda: side(300.0, 134_000.0, False),
                   lambda t: None)
    assert faulting.keep
    assert "faulted in 134,000 pages a batch against 720 with it" in faulting.reason
    # faults alike (a JPEG pipeline: PIL's own allocator), or too few to cost a batch 3%
    for fresh_faults, kept_faults in ((37_600.0, 37_400.0), (2_000.0, 100.0)):
        alike = HeapDecision(available=True)
        alike.check(side(400.0, kept_faults, True), lambda: side(300.0, fresh_faults, False),
                    lambda t: None)
        assert not alike.keep, (fresh_faults, kept_faults)
    # the fresh trial as the tune runs it, FAULT_BATCHES long: its rate is not believed,
    # its faults decide (and a rate faster by chance does not undo them)
    short_fresh = dataclasses.replace(side(600.0, 134_000.0, False), conclusive=False,
                                      batches=6, rate_ci=None)
    brief = HeapDecision(available=True)
    brief.check(side(400.0, 720.0, True), lambda: short_fresh, lambda t: None)
    assert brief.keep and "134,000 pages a batch" in brief.reason
    # the fresh workers faster beyond the noise: their faults do not outweigh their rate
    faster = HeapDecision(available=True)
    faster.check(side(200.0, 720.0, True), lambda: side(400.0, 134_000.0, False),
                 lambda t: None)
    assert not faster.keep


def test_under_a_limit_that_leaves_too_little_it_is_not_measured_and_the_pick_says_so():
    """NOTE [ Deciding freed memory during the search ]: a limit leaving less than the fresh
    trial (its start and FAULT_BATCHES past its warm-up: 1.5 + 8 x 0.067 s here) and one more
    like the first, for the search's predicted count: nothing run, nothing kept, said."""
    ran = []

    def fresh():
        ran.append(1)
        return _search_trial(1, 160.0, keep=False)

    first = dataclasses.replace(_search_trial(1, 240.0), seconds=20.0)
    short = HeapDecision(available=True)
    assert short.check(first, fresh, lambda t: None, time_left_s=21.9) is first
    assert not ran and short.skipped and short.decided and not short.first_keeps
    rec = Recommendation({"num_workers": 2}, 300.0, 3.0, ("2 workers",))
    assert "Not measured in the time this tune had" in short.recommend(rec, [first]).reasons[-1]
    room = HeapDecision(available=True)
    room.check(first, fresh, lambda t: None, time_left_s=22.2)
    assert ran == [1] and not room.skipped and room.keep

