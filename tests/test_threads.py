"""Threads per worker (NOTE [ Threads per worker ], instrument/threads.py): the pools read in
real workers, the diagnostic, the setting in configs, settings files and snippets, the search's
decision, and a real tune checked against plain loops."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import numpy  # noqa: F401 - loads numpy's OpenBLAS, as a dataset that uses numpy does
import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dataloader_tuner import LimitThreads, load_settings
from dataloader_tuner.analyse import oversubscription
from dataloader_tuner.analyse.hotspots import SampledProfile, TorchThreads, stage_of
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.dashboard.jobs import controls_from_settings, settings_from_controls
from dataloader_tuner.errors import ConfigError
from dataloader_tuner.instrument import threads
from dataloader_tuner.settings import read_settings, recommended_config, tuned_values
from dataloader_tuner.tune.same_settings import same_settings
from dataloader_tuner.tune.recommend import Recommendation
from dataloader_tuner.tune.thread_pools import LIMITED_PHASE, ThreadsDecision
from tests.real.plain_loop import plain_rate

from .conftest import ROOT, dataset_path
from .test_tuner import trial

CORES = psutil.cpu_count() or 1
needs_cores = pytest.mark.skipif(CORES < 2, reason="a pool of one thread per core needs 2 cores")


def raise_torch_threads(worker_id):
    torch.set_num_threads(2)


class PoolsSeen(Dataset):
    """Each sample is its worker's pools, as read there."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return threads.pools()


def _worker_pools(init_fn=None) -> dict:
    loader = DataLoader(PoolsSeen(), batch_size=None, num_workers=1, worker_init_fn=init_fn)
    return next(iter(loader))


@needs_cores
def test_a_worker_reads_its_pools_and_limit_threads_sets_each_to_one():
    own = threads.pools()
    if own.get("openblas", 1) < 2:
        pytest.skip("numpy's OpenBLAS runs one thread here (OPENBLAS_NUM_THREADS, affinity)")
    as_started = _worker_pools()
    # DataLoader sets torch's pool to one thread, not OpenBLAS's (found among loaded libraries)
    assert as_started["torch"] == 1 and as_started["openblas"] == own["openblas"]
    # the user's own init runs first: one that raises torch's pool is overruled
    limited = _worker_pools(LimitThreads(raise_torch_threads))
    assert limited["openblas"] == 1 and all(size == 1 for size in limited.values())
    assert threads.limits_threads(LimitThreads(None))
    assert repr(LimitThreads(_worker_pools)) == "LimitThreads(_worker_pools)"


def test_helper_threads_share_of_a_process_cpu():
    use = threads.thread_use(psutil.Process())
    assert use is not None and 0.0 <= use.helper_share <= 1.0 and use.busy_threads >= 1


def test_oversubscribed_needs_more_busy_threads_than_cpus_and_the_pools_at_work():
    blas = [{"torch": 1, "openblas": 8}]
    found = oversubscription.oversubscribed(blas, [(0.5, 8), (0.5, 8)], 4, 8, 20.0)
    assert found is not None and found.pool == "openblas" and found.limits_can_help
    assert "each worker keeps 8 threads busy (4 workers: 32 threads on 8 CPU(s))" in found.said(4, 8)
    assert oversubscription.oversubscribed(blas, [(0.05, 1)], 4, 8, 20.0) is None  # the pool sits idle
    assert oversubscription.oversubscribed(blas, [(0.5, 2)], 4, 8, 20.0) is None  # 8 threads, 8 CPUs
    # 0.1 ms of CPU a batch: the thread sending them does as much as the making; not judged
    assert oversubscription.oversubscribed(blas, [(0.7, 3)], 4, 8, 0.1) is None
    # many busy threads beyond any library pool: the dataset's own; LimitThreads cannot help
    own = oversubscription.oversubscribed([{"torch": 1, "openblas": 2}], [(0.55, 9)], 2, 2, 10.0)
    assert own is not None and not own.limits_can_help
    assert "look like threads your dataset starts itself" in own.said(2, 2)


def test_the_diagnostic_reads_probes_and_resource_rows():
    probes = [{"pid": 10 + i, "worker_id": i, "probe": {"pools": {"torch": 1, "openblas": 4}}}
              for i in range(2)]
    rows = [{"pid": 10 + i, "role": "worker", "helper_cpu_share": 0.5, "busy_threads": 4}
            for i in range(2)]
    found = oversubscription.thread_oversubscription(probes, rows, 2, 4, 20.0)
    assert found[0].code == "thread_oversubscription"
    assert found[0].evidence["pool"] == "openblas" and "LimitThreads" in found[0].fix
    torch_raised = [{**p, "probe": {"pools": {"torch": 4}}} for p in probes]
    assert "raised it again" in oversubscription.thread_oversubscription(torch_raised, rows, 2, 4,
                                                                20.0)[0].message
    assert oversubscription.thread_oversubscription(probes, rows, 0, 4, 20.0) == []


def test_torchs_own_hand_off_threads_are_not_a_pool():
    # leaky_cache.py's workers as read (2 workers, 2 CPUs): 0.24-0.26 of their CPU done by
    # other threads, 3 busy; the sampler saw the queue's feeder and the resource sharer do
    # 0.26 of it. Counted as openblas's pool, this was flagged in CI.
    probes = [{"pid": 10 + i, "worker_id": i, "probe": {"pools": {"torch": 1, "openblas": 2}}}
              for i in range(2)]
    rows = [{"pid": 10 + i, "role": "worker", "helper_cpu_share": 0.26, "busy_threads": 3}
            for i in range(2)]
    assert oversubscription.thread_oversubscription(probes, rows, 2, 2, 2.5)  # unknown: flagged
    handing_off = TorchThreads(cpu_share=0.26, busy=2)
    assert oversubscription.thread_oversubscription(probes, rows, 2, 2, 2.5,
                                            lambda pid: handing_off) == []
    # a pool at work beside them still is
    pooled = [{**row, "helper_cpu_share": 0.55, "busy_threads": 5} for row in rows]
    found = oversubscription.thread_oversubscription(probes, pooled, 2, 2, 2.5, lambda pid: handing_off)
    assert found and found[0].evidence["helper_cpu_share"] == 0.29


def test_the_sampled_profile_tells_torchs_hand_off_threads_per_process():
    profile = SampledProfile()
    profile.add(7, [("main", [], 0.6, 1.0, 60), ("QueueFeederThread", [], 0.3, 0.3, 10),
                    ("Thread-2 (_serve)", [], 0.1, 0.1, 10)])
    profile.add(8, [("main", [], 1.0, 1.0, 60)])
    seen = profile.torch_threads(7)
    assert seen is not None and seen.cpu_share == pytest.approx(0.4) and seen.busy == 2
    assert profile.torch_threads(8) == TorchThreads(cpu_share=0.0, busy=0)
    assert profile.torch_threads(9) is None
    assert stage_of("Thread-2 (_serve)", []) == "hand-off"


def init(worker_id):
    """A user's own worker_init_fn."""


def test_the_setting_in_configs_snippets_and_settings_files(tmp_path):
    config = LoaderConfig(batch_size=8, num_workers=2, worker_init_fn=init, worker_threads=1)
    assert "worker_threads" not in config.to_kwargs()  # not DataLoader's
    assert config.snippet().endswith("worker_init_fn=dataloader_tuner.LimitThreads(init))")
    assert config.to_json_dict()["worker_threads"] == 1
    assert config.replace(num_workers=0).worker_threads is None
    with pytest.raises(ConfigError, match="worker_threads must be 1"):
        LoaderConfig(num_workers=2, worker_threads=4)
    with pytest.raises(ConfigError, match="only applies with worker processes"):
        LoaderConfig(worker_threads=1)
    assert not same_settings(config, config.replace(worker_threads=None))
    values = tuned_values({"num_workers": 2, "worker_threads": 1})
    assert recommended_config(LoaderConfig(batch_size=8), values).worker_threads == 1
    assert tuned_values({"num_workers": 0, "worker_threads": 1})["worker_threads"] is None

    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"dataloader_kwargs": {"num_workers": 2, "worker_threads": 1}}))
    assert read_settings(str(path))["worker_threads"] == 1  # as the CLI sends it to a run
    kwargs = load_settings(str(path), worker_init_fn=init)
    assert "worker_threads" not in kwargs
    assert isinstance(kwargs["worker_init_fn"], LimitThreads)
    assert kwargs["worker_init_fn"].init_fn is init
    DataLoader(PoolsSeen(), batch_size=None, **kwargs)  # DataLoader takes them as they are

    # the page's "One thread per pool in each worker" box, both ways
    controls = {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2,
                "persistent_workers": False, "batch_size": 8,
                **controls_from_settings({"num_workers": 2, "worker_threads": 1})}
    assert controls["one_thread"] is True
    assert settings_from_controls(controls)["worker_threads"] == 1
    assert "worker_threads" not in settings_from_controls({**controls, "one_thread": False})


def _searched(n, rate, threads=None, share=0.5, busy=2, cpu_ms=20.0, **kw):
    return trial(n, rate, rate_ci=0.03, worker_threads=threads, cpu_ms=cpu_ms,
                 worker_pools={"torch": 1, "openblas": 2}, helper_cpu_share=share,
                 busy_threads=busy, **kw)


def test_the_search_decides_once_at_the_first_oversubscribed_trial():
    decision = ThreadsDecision(cpus_usable=2)
    ran, shown = [], []

    def measure(worker_threads, repeat):
        ran.append(worker_threads)
        return _searched(2, 900.0 if worker_threads == 1 else 200.0, worker_threads)

    fits = _searched(1, 400.0)  # one worker's 2 threads on 2 CPUs
    assert decision.check(fits, measure, shown.append) is fits and not ran
    kept = decision.check(_searched(2, 210.0), measure, shown.append)
    assert ran == [1, 1, None]  # A B B A, the search's trial the first A
    assert kept.worker_threads == 1 and kept.phase == "search"
    assert decision.worker_threads == 1 and len(shown) == 3
    assert sum(t.phase == LIMITED_PHASE for t in shown) == 1
    assert "LimitThreads(): 900 samples/s with one thread per pool" in decision.reason
    later = _searched(3, 950.0, 1)
    assert decision.check(later, measure, shown.append) is later and len(ran) == 3

    rec = Recommendation({"num_workers": 3}, 950.0, 3.0, ("3 workers",))
    assert decision.recommend(rec, [later]).kwargs["worker_threads"] == 1
    assert "worker_threads" not in decision.recommend(rec, [fits]).kwargs
    no_workers = Recommendation({"num_workers": 0}, 950.0, 3.0, ("0 workers",))
    assert decision.recommend(no_workers, []) == no_workers  # no reason about pools it lacks
    fast = ThreadsDecision(cpus_usable=2)  # 0.3 ms of CPU a batch: not judged, not measured
    fast.check(_searched(2, 210.0, cpu_ms=0.3), measure, shown.append)
    assert not fast.decided


def test_the_search_keeps_the_pools_where_limiting_does_not_pay():
    decision = ThreadsDecision(cpus_usable=2)
    kept = decision.check(_searched(2, 500.0),
                          lambda threads_, repeat: _searched(2, 505.0, threads_), lambda t: None)
    assert kept.worker_threads is None and decision.worker_threads is None
    assert "did not pay beyond its noise" in decision.reason


def _cli(*args: str, db) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "dataloader_tuner", *args, "--json", "--db", str(db)],
        capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=400)
    return json.loads(run.stdout)


@needs_cores
@pytest.mark.slow  # ~25 s: two profiles
@pytest.mark.parametrize("fixture,pool", [("blas_threads.py", "openblas"),
                                          ("torch_threads.py", "torch")])
@pytest.mark.host_speed
def test_a_profile_names_the_pool_that_oversubscribes(fixture, pool, tmp_path):
    args = ["--num-workers", "2"] if fixture == "blas_threads.py" else []
    # 10 s: the profile's seconds include its workers' start, and two spawned workers that
    # import torch took 5.6-7.4 s to start with both cores busy elsewhere (CI once had 4 s
    # end with no batch after warm-up, so no CPU per batch to judge the threads by)
    doc = _cli("profile", dataset_path(fixture), "--seconds", "10", *args, db=tmp_path / "r.db")
    assert doc["status"] == "ok", doc.get("error")
    print("startup_s", doc["startup_s"], "steady_batches", doc["steady_batches"],
          [w["code"] for w in doc["warnings"]])
    found = {w["code"]: w for w in doc["warnings"]}["thread_oversubscription"]
    assert found["evidence"]["pool"] == pool
    assert found["evidence"]["helper_cpu_share"] >= oversubscription.HELPER_SHARE_MIN


@needs_cores
@pytest.mark.slow  # ~60-80 s: a real tune, then plain loops
@pytest.mark.host_speed
def test_a_tune_limits_the_threads_where_plain_loops_confirm_it(tmp_path):
    """numpy's OpenBLAS runs one thread per core in each worker: the tune measures one thread
    per pool faster, and plain DataLoader loops with and without LimitThreads agree."""
    target = dataset_path("blas_threads.py")
    # 40 s: with 20 a loaded CI machine ended the search at 0, 1 and 2 workers, before the
    # threads were tried (0 workers, whose BLAS uses both cores, led while threads were not)
    doc = _cli("tune", target, "--budget-s", "40", "--max-workers", "3", db=tmp_path / "r.db")
    assert doc["status"] == "ok", doc.get("error")
    recommended = doc["recommended"]
    # (CI once picked 0 workers with no threads line, not seen here in 3 runs; a failure
    # prints what each trial saw of the pools, for the next to tell why)
    print(*[(t["phase"], t.get("num_workers"), t.get("worker_threads"),
             round(t["samples_per_s"]), t.get("helper_cpu_share"), t.get("busy_threads"),
             t.get("worker_pools")) for t in doc["trials"]], *doc["reasons"], sep="\n")
    assert recommended.get("worker_threads") == 1, doc["reasons"]
    # LimitThreads outermost; the heap check may wrap KeepFreedMemory inside it
    assert "worker_init_fn=dataloader_tuner.LimitThreads(" in doc["snippet"]
    assert any(t["phase"] == "threads_default" for t in doc["trials"])
    own_threads = torch.get_num_threads()
    settings = {k: v for k, v in recommended.items()
                if k not in ("worker_threads", "keep_freed_memory")}  # the tuner's own keys
    settings["num_workers"] = max(settings["num_workers"], 2)
    gains = []
    for pair in range(2):
        rates = {}
        for limit in ((False, True) if pair % 2 == 0 else (True, False)):
            init = LimitThreads() if limit else None
            rates[limit] = plain_rate(target, 3.0, worker_init_fn=init,
                                      **settings)["samples_per_s"]
        gains.append(rates[True] / rates[False])
    assert statistics.median(gains) > 1.5, gains
    assert torch.get_num_threads() == own_threads  # LimitThreads left this process alone


WATCHED_JOB = """
import sys, time
sys.path.insert(0, {folder!r})
from blas_threads import dataset
from torch.utils.data import DataLoader
from dataloader_tuner import watch
loader = watch(DataLoader(dataset, batch_size=8, num_workers=2), name="blas", db={db!r})
started = time.monotonic()
while time.monotonic() - started < 5:
    for batch in loader:
        if time.monotonic() - started > 5:
            break
"""


@pytest.mark.host_speed  # sampled CPU shares, as its profile sibling
@needs_cores
@pytest.mark.slow  # ~10 s: a watched training loop
def test_a_watched_job_is_told_and_its_resource_rows_keep_the_thread_use(tmp_path):
    from dataloader_tuner import RunStore

    db = str(tmp_path / "runs.sqlite")
    script = WATCHED_JOB.format(folder=os.path.dirname(dataset_path("blas_threads.py")), db=db)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=ROOT))
    store = RunStore(db)
    try:
        run = store.list_runs()[0]
        assert "thread_oversubscription" in {w.code for w in run.result.warnings}
        rows = [r for r in store.resources(run.id) if r["role"] == "worker"]
        assert rows and all(r["busy_threads"] is None or r["busy_threads"] >= 1 for r in rows)
        assert max(r["helper_cpu_share"] or 0.0 for r in rows) >= oversubscription.HELPER_SHARE_MIN
    finally:
        store.close()
