"""Failure explanations and pitfall rules on hand-made inputs, including the cases this machine
cannot produce (no GPU, 24 GB of /dev/shm): torch's exact wording comes from KNOWLEDGE.md."""

import collections
import math
import os
import subprocess
import sys
import sysconfig
import time

import numpy as np
import psutil
import pytest
from torch.utils.data import Dataset

from dataloader_tuner.analyse import pitfalls
from dataloader_tuner.analyse.memory_growth import worker_memory_growth
from dataloader_tuner.instrument.resources import ResourceSampler
from dataloader_tuner.analyse.overdue import outside_users_code, stuck_at
from dataloader_tuner.child.failures import explain_failure, hang_error, may_be_worker_death
from dataloader_tuner.instrument.probes import shape_mismatch
from dataloader_tuner.system import SystemSnapshot

import torch


@pytest.mark.parametrize("text,error_type,phrase", [
    ("DataLoader worker (pid 4242) is killed by signal: Killed. ", "worker_killed",
     "out-of-memory killer"),
    ("DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that "
     "dataloader's workers are out of shared memory.", "worker_killed", "--shm-size"),
    ("unable to write to file </torch_123_456_0>: No space left on device (28)", "shm_full",
     "/dev/shm"),
    ("Too many open files. Communication with the workers is no longer possible.",
     "too_many_open_files", "set_sharing_strategy('file_system')"),
    ("received 0 items of ancdata", "too_many_open_files", "ulimit -n"),
    ("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent "
     "call last):\nRuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA "
     "with multiprocessing, you must use the 'spawn' start method", "cuda_in_fork", "spawn"),
    ("Can't pickle local object 'make.<locals>.Local'", "not_picklable", "module-level"),
    ("DataLoader worker (pid(s) 17) exited unexpectedly", "worker_exited", "num_workers=0"),
])
def test_torch_failure_texts_get_a_headline_and_a_fix(text, error_type, phrase):
    error = explain_failure(RuntimeError(text))
    assert error.type == error_type and phrase in error.message
    assert "\n" not in error.message


def test_hang_without_outstanding_detail_still_says_what_to_do():
    error = hang_error(5.0, [])
    assert error.type == "hang" and "within 5 s" in error.message and "--timeout-s" in error.message


def test_shape_mismatch_names_the_field():
    samples = [{"image": torch.zeros(3, 8, 8), "boxes": torch.zeros(2, 4)},
               {"image": torch.zeros(3, 8, 8), "boxes": torch.zeros(5, 4)}]
    assert shape_mismatch(samples) == ("field 'boxes': shapes (2, 4) at sample 0 and (5, 4) at "
                                       "sample 1 of the batch")
    assert shape_mismatch([torch.zeros(2), torch.zeros(2)]) is None


def test_shm_pressure_from_batches_in_flight():
    shm = {"free_mb": 64.0, "total_mb": 64.0}  # Docker's default
    found = pitfalls.shm_pressure(8, 2, 4 * 2**20, shm)  # 8 x 2 x 4 MB = 64 MB
    assert found[0].code == "shm_too_small" and found[0].evidence["in_flight_mb"] == 64.0
    assert "--shm-size" in found[0].fix
    assert pitfalls.shm_pressure(2, 2, 1 * 2**20, shm) == []
    assert pitfalls.shm_pressure(0, 0, 4 * 2**20, shm) == []


def test_shm_read_during_the_run_counts_the_batches_in_it_as_their_own():
    """Read while the run goes on, /dev/shm's used space holds the run's own batches: 16 MB in
    flight with 40 MB free is 56 MB for them (no warning), not 40; another job taking 30 MB
    more leaves 26 for them: over half."""
    in_flight = (2, 2, 4 * 2**20)  # 16 MB
    assert pitfalls.shm_pressure(*in_flight, {"free_mb": 40.0, "total_mb": 64.0},
                                 in_use=True) == []
    assert pitfalls.shm_pressure(*in_flight, {"free_mb": 24.0, "total_mb": 64.0})  # not in use
    climbed = pitfalls.shm_pressure(*in_flight, {"free_mb": 10.0, "total_mb": 64.0},
                                    in_use=True)[0]
    assert climbed.evidence["shm_free_mb"] == 26.0 and climbed.evidence["during_run"]
    assert not climbed.evidence["will_not_fit"]


def test_shm_pressure_counts_the_nodes_ranks_and_says_when_batches_will_not_fit():
    shm = {"free_mb": 64.0, "total_mb": 64.0}
    near = pitfalls.shm_pressure(2, 2, 8 * 2**20, shm)[0]  # 32 MB: half of it
    assert not near.evidence["will_not_fit"] and "may die" in near.message
    # the same loader on each of a node's 4 ranks: 128 MB against 64
    crossing = pitfalls.shm_pressure(2, 2, 8 * 2**20, shm, ranks=4, estimated=True)[0]
    assert crossing.evidence == {"in_flight_mb": 128.0, "shm_free_mb": 64.0, "ranks": 4,
                                 "will_not_fit": True, "estimated": True, "during_run": False}
    assert "x 4 ranks on this node" in crossing.message and "sample 0 x batch_size" in \
        crossing.message and "will die" in crossing.message
    for fix in ("fewer workers", "prefetch_factor", "--shm-size", "file_system"):
        assert fix in crossing.message
    assert "set_sharing_strategy('file_system')" in crossing.fix


def test_a_full_shm_is_said_to_fit_nothing_and_a_batch_samplers_batches_are_not_guessed():
    full = pitfalls.shm_pressure(1, 2, 1 * 2**20, {"free_mb": 0.0, "total_mb": 64.0})
    assert full and full[0].evidence["will_not_fit"]
    from dataloader_tuner.analyse.shm import expected_batch_bytes
    from dataloader_tuner.record.cards import DatasetCard

    card = DatasetCard(target="t", found_as="dataset", class_name="D", kind="map", length=8,
                       defines_batch_size=False, module_batch_size=None, has_collate_fn=False,
                       has_sampler=True, has_train_step=False, has_dataloader_kwargs=False,
                       sample_bytes=1000)
    assert expected_batch_bytes(card, {"batch_size": 4}) == 4000.0
    assert expected_batch_bytes(card, {"batch_size": None}) == 1000.0  # items are batches
    assert expected_batch_bytes(card, {"batch_sampler": "MySampler"}) is None


def test_a_smaller_shm_can_be_rehearsed(monkeypatch):
    from dataloader_tuner import system

    monkeypatch.setenv(system.SHM_MB_ENV, "64")
    shm = system.shm_usage()
    assert shm is not None and shm["total_mb"] == 64.0 and shm["rehearsed"]
    assert shm["free_mb"] == 64.0 - shm["used_mb"] and shm["used_mb"] <= 64.0
    monkeypatch.setenv(system.SHM_MB_ENV, "lots")  # not a number: the real size, unlabelled
    assert not system.shm_usage()["rehearsed"]
    monkeypatch.delenv(system.SHM_MB_ENV)
    assert not system.shm_usage()["rehearsed"]


def test_rng_only_flagged_when_workers_share_a_state():
    same = [{"worker_id": w, "probe": {"rng_used": {"self.rng": "abc"}}} for w in (0, 1, 2)]
    found = pitfalls.duplicated_rng(same)
    assert found[0].evidence == {"generator": "self.rng", "workers": [0, 1, 2]}
    assert "info.dataset.rng" in found[0].fix
    differ = [{"worker_id": w, "probe": {"rng_used": {"self.rng": f"s{w}"}}} for w in (0, 1)]
    assert pitfalls.duplicated_rng(differ) == []
    main_only = [{"worker_id": -1, "probe": {"rng_used": {"self.rng": "abc"}}}]
    assert pitfalls.duplicated_rng(main_only) == []


def test_oversubscription_rules():
    system = SystemSnapshot.from_dict({"cpus_usable": 2, "other_load_cpus": 0.0})
    assert pitfalls.cpu_oversubscription(4, system, 0.9)[0].code == "more_workers_than_cpus"
    assert pitfalls.cpu_oversubscription(4, system, 0.1) == []  # waiting workers may outnumber
    # a count the tuner measured to pay is not second-guessed; more than it still is
    assert pitfalls.cpu_oversubscription(3, system, 0.9, tuned_workers=3) == []
    assert pitfalls.cpu_oversubscription(5, system, 0.9, tuned_workers=3)
    busy = pitfalls.cpu_oversubscription(
        1, SystemSnapshot.from_dict({"cpus_usable": 8, "other_load_cpus": 4.0}), 0.9)
    assert busy[0].code == "cpus_busy_elsewhere" and busy[0].severity == "info"


def test_restarts_each_epoch_only_without_persistent_workers():
    epochs = [{"startup_s": 0.5}, {"startup_s": 0.4}, {"startup_s": 0.4}]
    config = {"num_workers": 4, "persistent_workers": False}
    found = pitfalls.restarts_each_epoch(config, epochs, 3.0, making_s=0.1)[0]
    assert found.evidence["startup_s"] == 0.4
    # what persistent_workers saves: each later start-up less the batch a kept worker makes
    assert found.evidence["saving_per_epoch_s"] == pytest.approx(0.3)
    assert found.evidence["saving_s"] == pytest.approx(0.3 * (len(epochs) - 1))
    assert "would have saved about" in found.message
    assert pitfalls.restarts_each_epoch({**config, "persistent_workers": True}, epochs, 3.0) == []
    assert pitfalls.restarts_each_epoch(config, epochs, 300.0) == []


def test_a_worker_reaped_before_torch_saw_its_signal_is_still_named():
    error = explain_failure(RuntimeError("DataLoader worker (pid(s) 77) exited unexpectedly"),
                            {77: 7})  # SIGBUS
    assert error.type == "worker_killed" and "Bus error" in error.message
    assert "--shm-size" in error.message


def test_a_broken_handover_connection_is_read_as_a_worker_death():
    # The main process was receiving a tensor's file descriptor when the worker died.
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert may_be_worker_death(reset)
    assert may_be_worker_death(RuntimeError("DataLoader worker (pid(s) 77) exited unexpectedly"))
    assert not may_be_worker_death(KeyError("label"))
    error = explain_failure(reset, {77: 7})
    assert error.type == "worker_killed" and "--shm-size" in error.message


# -- worker memory growth: resource rows as ResourceSampler makes them ---------------------------

def worker_rows(seconds, rss, dirty, uss=None, pid=7, worker_id=0, private_every=4):
    """RSS every 0.5 s, private memory every 2 s (None between), over ``seconds``."""
    uss = uss or dirty
    rows = []
    for i in range(int(seconds / 0.5) + 1):
        t = 0.5 + 0.5 * i
        read = i % private_every == 0
        rows.append({"t": t, "pid": pid, "role": "worker", "worker_id": worker_id,
                     "rss_mb": rss(t), "uss_mb": uss(t) if read else None,
                     "pss_mb": None, "dirty_mb": dirty(t) if read else None})
    return rows


def flat(mb):
    return lambda t: mb


def test_growth_is_judged_from_a_workers_first_row_when_its_memory_is_read_later():
    """The sampler reads a worker's memory from its second 2 on (USS_MIN_AGE_S): the 2 s
    warm-up counts from the worker's first row, so a run of 10.5 s is judged as before."""
    leak = lambda t: 13 + 457 * t / 60  # noqa: E731
    rows = worker_rows(10.5, flat(1476), leak)
    assert worker_memory_growth(rows)
    late = [dict(r, uss_mb=None, dirty_mb=None) if r["t"] < 2.0 else r for r in rows]
    assert [d.code for d in worker_memory_growth(late)] == ["worker_memory_growth"]


def test_copy_on_read_leak_is_flagged_per_worker_with_the_serialize_fix():
    # pytorch issue 13246: private memory ~13 -> ~470 MB in 60 s per worker, RSS flat
    leak = lambda t: 13 + 457 * t / 60  # noqa: E731
    rows = (worker_rows(60, flat(1476), leak, pid=7, worker_id=0)
            + worker_rows(60, flat(1476), leak, pid=8, worker_id=1))
    found = worker_memory_growth(rows)
    assert [d.code for d in found] == ["worker_memory_growth"]
    evidence = found[0].evidence
    assert evidence["copy_on_read"] and "copy-on-read" in found[0].message
    assert [w["worker_id"] for w in evidence["workers"]] == [0, 1]
    worker = evidence["workers"][0]
    assert worker["mb_per_min"] == pytest.approx(457, rel=0.02)
    assert worker["rss_start_mb"] == worker["rss_end_mb"] == 1476
    assert 20 < worker["uss_start_mb"] < worker["uss_end_mb"] < 480
    fix = found[0].fix
    assert "np.frombuffer" in fix and "np.int64" in fix and "pickle.loads" in fix
    scope = {}
    exec(fix, scope)  # the fix runs as pasted and keeps the records in numpy, not in a list
    records = [{"file_name": f"{i}.jpg", "annotations": [{"bbox": [i, 0, 1, 1]}]}
               for i in range(50)]
    serialized = scope["SerializedList"](records)
    assert len(serialized) == 50 and [serialized[i] for i in range(50)] == records
    assert all(not isinstance(v, list) for v in vars(serialized).values())


def test_rss_alone_never_flags():
    """File-backed pages (LMDB, np.memmap) count in RSS as they are read."""
    rising = lambda t: 200 + 40 * t  # noqa: E731
    assert worker_memory_growth(worker_rows(30, rising, flat(12))) == []
    no_private = [{k: v for k, v in r.items() if k not in ("uss_mb", "dirty_mb")}
                  for r in worker_rows(30, rising, flat(12))]
    assert worker_memory_growth(no_private) == []


def test_file_pages_in_uss_are_not_a_leak_but_uss_is_judged_without_dirty_readings():
    # np.memmap read by two workers at disjoint offsets (measured): USS +140 MB in 24 s,
    # private dirty flat at ~12 MB. The pages are clean file cache that only one worker maps.
    rss, uss = (lambda t: 170 + 10 * t), (lambda t: 19 + 6 * t)  # noqa: E731
    assert worker_memory_growth(worker_rows(24, rss, flat(12), uss=uss)) == []
    without_dirty = [{**r, "dirty_mb": None} for r in worker_rows(24, rss, flat(12), uss=uss)]
    assert worker_memory_growth(without_dirty)[0].evidence["workers"][0][
        "measure"] == "uss"


def test_a_bounded_buffer_that_fills_then_stops_is_not_flagged():
    fills = lambda t: 60 + 65 * min(t, 5.0)  # noqa: E731  a shuffle buffer: 5 s, then flat
    assert worker_memory_growth(worker_rows(25, lambda t: 200 + fills(t), fills)) == []


def test_a_noisy_start_is_not_flagged():
    jumpy = lambda t: (40 if t < 2.0 else 380) + 3 * ((-1) ** int(t))  # noqa: E731
    assert worker_memory_growth(worker_rows(30, jumpy, jumpy)) == []


def test_a_one_time_allocation_is_not_flagged():
    step = lambda t: 40 if t < 20 else 100  # noqa: E731  e.g. a lookup table built on first use
    assert worker_memory_growth(worker_rows(25, flat(1476), step)) == []


def test_the_slow_creep_of_a_healthy_jpeg_worker_is_not_flagged():
    creep = lambda t: 32 + 4 * t / 25  # noqa: E731  measured: +4 MB in 25 s, RSS flat
    assert worker_memory_growth(worker_rows(25, flat(249), creep)) == []


def test_a_buffer_levelling_off_is_not_flagged_but_copy_on_read_slowing_down_is():
    levels = lambda t: 400 * (1 - math.exp(-t / 6))  # noqa: E731  still +35 MB in the last half
    buffer = worker_rows(25, lambda t: 200 + levels(t), levels)  # new pages: RSS grows too
    assert worker_memory_growth(buffer) == []
    # RSS flat: inherited pages turning private, until each worker has a copy of everything
    found = worker_memory_growth(worker_rows(25, flat(1476), levels))
    assert found[0].evidence["copy_on_read"]


@pytest.mark.parametrize("private_every", [4, 1])
def test_a_run_too_short_to_tell_a_leak_from_a_filling_buffer_is_not_judged(private_every):
    leak = lambda t: 13 + 10 * t  # noqa: E731
    rows = worker_rows(8, flat(1476), leak, private_every=private_every)
    assert worker_memory_growth(rows) == []


def test_a_growing_cache_gets_the_cache_fix():
    cache = lambda t: 50 + 8 * t  # noqa: E731  RSS rises with private memory
    found = worker_memory_growth(worker_rows(20, lambda t: 150 + cache(t), cache))
    assert found and not found[0].evidence["copy_on_read"]
    assert "lru_cache" in found[0].fix and "numpy" in found[0].fix


# -- ResourceSampler against a real process ------------------------------------------------------

ALLOCATOR = """import sys
print("ready", flush=True)
sys.stdin.readline()
data = b"x" * (50 << 20)  # 50 MB written: private, dirty pages
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def allocator():
    proc = subprocess.Popen([sys.executable, "-c", ALLOCATOR], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=5)


def _row(event, pid):
    return next(p for p in event.procs if p["pid"] == pid)


def walk_costing(cpu_s: float, walks: list[int] | None = None):
    """A stand-in for reading a worker's smaps_rollup that spends ``cpu_s`` of our CPU, as a
    walk of its page tables does, noting each pid read in ``walks``."""
    def walk(pid):
        if walks is not None:
            walks.append(pid)
        started = time.thread_time()
        while time.thread_time() - started < cpu_s:
            pass
        return {"uss_mb": 1.0, "pss_mb": 1.0, "dirty_mb": 1.0}
    return walk


def test_resource_sampler_reads_worker_private_memory_every_few_seconds(allocator,
                                                                          monkeypatch):
    monkeypatch.setattr(ResourceSampler, "USS_MIN_AGE_S", 0.0)  # the allocator is new
    sampler = ResourceSampler({allocator.pid: 0})
    before = _row(sampler.sample(0.0), allocator.pid)
    assert before["uss_mb"] > 0 and before["dirty_mb"] > 0 and before["pss_mb"] > 0
    again = _row(sampler.sample(0.5), allocator.pid)
    assert again["uss_mb"] is None and again["rss_mb"] > 0  # not due again for 2 s
    main = _row(sampler.sample(0.6), os.getpid())
    assert main["uss_mb"] is None  # the main process (the biggest) is never walked
    allocator.stdin.write("go\n")
    allocator.stdin.flush()
    assert allocator.stdout.readline() == "done\n"
    sampler.uss_due.clear()  # due now, instead of waiting the 2 s
    sampler.uss_gate = 0.0
    after = _row(sampler.sample(1.0), allocator.pid)
    assert after["uss_mb"] - before["uss_mb"] > 45 and after["dirty_mb"] - before["dirty_mb"] > 45


@pytest.mark.parametrize("share", [ResourceSampler.USS_MAX_CPU_SHARE,
                                   ResourceSampler.ENGINE_USS_CPU_SHARE])
def test_the_next_memory_read_waits_for_its_cost_over_the_share_given(allocator, monkeypatch,
                                                                       share):
    """A watched job's reads keep within 1% of a core; the engine's own profile, a process of
    ours, may take more, so a default profile reads big workers often enough to judge."""
    monkeypatch.setattr(ResourceSampler, "_smaps_rollup", staticmethod(walk_costing(0.004)))
    monkeypatch.setattr(ResourceSampler, "USS_MIN_AGE_S", 0.0)
    sampler = ResourceSampler({allocator.pid: 0}, share)
    before = time.monotonic()  # (the read is at or after it: a preemption cannot shorten this)
    assert _row(sampler.sample(0.0), allocator.pid)["dirty_mb"] == 1.0
    pause = sampler.uss_gate - before
    # (a loaded VM's CPU clock also counts what was stolen from it: up to ~1.3x, CI)
    assert 0.004 / share * 0.8 <= pause <= 0.004 / share * 1.6, pause


@pytest.mark.slow  # real workers read in turns
def test_workers_private_memory_reads_share_one_cpu_budget_in_turns(monkeypatch):
    """Each read walks a worker's page tables (6-12 ms on a Lightning job's workers): one
    worker a sample, all of them within USS_MAX_CPU_SHARE of a core, the longest due first, so
    eight workers each get their turn; none before USS_MIN_AGE_S after it was first seen (an
    epoch's workers, restarting), and never a child that is not one of the loader's workers."""
    walks: list[int] = []
    monkeypatch.setattr(ResourceSampler, "_smaps_rollup", staticmethod(walk_costing(0.002, walks)))
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(9)]
    try:
        workers = {p.pid: i for i, p in enumerate(sleepers[:8])}  # the 9th: not a worker
        sampler = ResourceSampler(dict(workers))
        sampler.sample(0.0)
        assert walks == []  # just seen: not read yet
        for pid in sampler.uss_due:
            sampler.uss_due[pid] = 0.0  # as if USS_MIN_AGE_S had passed
        rounds = 0
        while set(walks) != set(workers) and rounds < 12:
            sampler.sample(0.5 * rounds)
            assert len(walks) <= rounds + 1  # one a sample at most
            pause = sampler.uss_gate - time.monotonic()
            # 2 ms / 1%: 0.2 s (less the time since); a loaded VM's CPU clock also counts
            # what was stolen from it (CI read 0.26 once)
            assert pause <= 0.4
            time.sleep(max(pause, 0.0) + 0.01)
            rounds += 1
        assert set(walks) == set(workers) and len(walks) == len(set(walks)) == 8, walks
        assert sleepers[8].pid not in walks
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def test_resource_sampler_keeps_a_process_whose_private_memory_is_off_limits(allocator,
                                                                            monkeypatch):
    monkeypatch.setattr(ResourceSampler, "_smaps_rollup", staticmethod(lambda pid: None))

    def denied(self):
        raise psutil.AccessDenied(self.pid)
    monkeypatch.setattr(psutil.Process, "memory_full_info", denied)
    row = _row(ResourceSampler({}).sample(0.0), allocator.pid)
    assert row["rss_mb"] > 0 and row["uss_mb"] is None and row["dirty_mb"] is None


# -- skewed labels ---------------------------------------------------------------------------

def test_sampling_noise_across_many_classes_is_not_skew():
    counts = dict(enumerate(np.random.default_rng(0).poisson(8, 1000).tolist()))
    seen = [n for n in counts.values() if n]
    assert max(seen) / min(seen) >= 5  # what the old rule called skew
    assert pitfalls.skewed_labels(counts) == []


def test_real_skew_is_flagged_with_its_ratio_and_bound():
    found = pitfalls.skewed_labels({0: 2200, 1: 100})
    evidence = found[0].evidence
    assert evidence["ratio"] == 22.0 and 5 <= evidence["ratio_lower_bound"] < 22
    assert evidence["labels_counted"] == 2300 and evidence["label_counts"] == {0: 2200, 1: 100}
    assert "22.0x" in found[0].message and "shuffled order" in found[0].message
    assert "WeightedRandomSampler" in found[0].fix


def test_a_ratio_from_a_handful_of_labels_is_not_skew():
    assert pitfalls.skewed_labels({0: 12, 1: 2}) == []
    assert pitfalls.skewed_labels({0: 10}) == []


def test_sequential_counts_are_judged_only_when_they_cover_the_dataset():
    counts = {0: 2200, 1: 100}
    assert pitfalls.skewed_labels(counts, order_independent=False, dataset_len=100_000) == []
    assert pitfalls.skewed_labels(counts, order_independent=False) == []
    found = pitfalls.skewed_labels(counts, order_independent=False, dataset_len=2300)
    assert "sequential order" in found[0].message
    assert found[0].evidence["order"] == "sequential"


def _card(kind: str):
    from dataloader_tuner.record.cards import DatasetCard

    return DatasetCard("data.py", "dataset", "Data", kind, 10, False, None, False, False, False,
                       False)


def test_label_order_from_the_loader_settings():
    mapped = _card("map")
    assert pitfalls.label_order({"shuffle": True}, mapped) is True
    assert pitfalls.label_order({"sampler": "WeightedRandomSampler(...)"}, mapped) is True
    assert pitfalls.label_order({}, mapped) is False
    assert pitfalls.label_order({"sampler": "MySampler(...)"}, mapped) is None
    assert pitfalls.label_order({}, _card("iterable")) is None


class Pairs(Dataset):
    """(x, label) samples and no .targets: 2200 of class 0, 100 of class 1, 700 of class 2."""

    labels = [0] * 2200 + [1] * 100 + [2] * 700

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return torch.zeros(2), torch.tensor(self.labels[index])


class WithTargets(Pairs):
    def __init__(self, as_tensor):
        self.targets = torch.tensor(self.labels) if as_tensor else list(self.labels)


class Dicts(Dataset):
    """Dict samples (a tokenizer pipeline's shape), the labels under "label", no label list."""

    def __len__(self):
        return len(Pairs.labels)

    def __getitem__(self, index):
        return {"input_ids": torch.zeros(3), "label": Pairs.labels[index]}


class Tuples(Dicts):
    def __getitem__(self, index):
        return torch.zeros(2), torch.tensor(Pairs.labels[index])


@pytest.mark.parametrize("dataset", [Pairs(), WithTargets(False), WithTargets(True), Dicts(),
                                     Tuples()],
                         ids=["labels-attr", "targets-list", "targets-tensor", "dict-samples",
                              "tuple-samples"])
def test_the_skew_fix_runs_as_pasted_and_balances_the_classes(dataset):
    scope = {"dataset": dataset}
    exec(pitfalls.SKEW_FIX, scope)
    torch.manual_seed(0)
    drawn = collections.Counter(Pairs.labels[i] for i in scope["sampler"])
    assert sum(drawn.values()) == len(dataset)
    for label in (0, 1, 2):
        assert drawn[label] / len(dataset) == pytest.approx(1 / 3, abs=0.04)


def test_skew_from_the_datasets_own_labels_says_so():
    found = pitfalls.skewed_labels({0: 880, 1: 40}, True, 920, source="dataset")
    assert found and "dataset's own label list" in found[0].message
    assert found[0].evidence["source"] == "dataset"


def test_measuring_cost_is_said_only_for_batches_faster_than_100_us():
    found = pitfalls.measuring_cost(19_600.0, 627_200.0)  # 51 us batches
    assert [d.code for d in found] == ["measuring_cost"]
    assert "every 51 us" in found[0].message and "627,200 samples/s" in found[0].message
    assert found[0].evidence["batch_us"] == 51.0
    assert pitfalls.measuring_cost(7_300.0, 233_600.0) == []  # 137 us: measured at >= 0.97
    assert pitfalls.measuring_cost(None, None) == []


def test_a_hang_is_placed_in_the_users_code_not_the_tools_or_torchs():
    ours = os.path.dirname(os.path.dirname(failures_file()))
    stdlib = sysconfig.get_paths()["stdlib"]
    stack = (
        "Current thread 0x1 (most recent call first):\n"
        f'  File "{stdlib}/threading.py", line 327 in wait\n'
        f'  File "{ours}/instrument/probes.py", line 236 in __getitems__\n'
        '  File "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py", line 52 '
        "in fetch\n"
        '  File "/venv/lib/python3.11/site-packages/lmdb_reader/store.py", line 40 in read\n'
        '  File "/repo/datasets/faces.py", line 18 in __getitem__\n\n'
        "Thread 0x2 (most recent call first):\n"
        '  File "/repo/helpers.py", line 5 in loop\n')
    assert stuck_at(stack) == "store.py:40 in read"  # a library the user installed counts
    assert stuck_at(stack.replace("lmdb_reader/store.py", "torch/x.py")) == (
        "faces.py:18 in __getitem__")
    assert stuck_at(f'  File "{stdlib}/threading.py", line 327 in wait') is None
    # the live line names where such a stack is, and says when there was none
    assert outside_users_code(stack) == "threading.py:327 in wait, not your code"
    assert outside_users_code(None) == "its stack could not be read"


def test_persistent_workers_are_not_suggested_when_keeping_them_saves_nothing():
    epochs = [{"startup_s": 0.5}, {"startup_s": 0.4}, {"startup_s": 0.4}]
    config = {"num_workers": 4, "persistent_workers": False}
    # the epoch's first batch takes as long as making one: a kept worker would wait it too
    assert pitfalls.restarts_each_epoch(config, epochs, 3.0, making_s=0.39) == []


def failures_file() -> str:
    from dataloader_tuner.child import failures
    return os.path.abspath(failures.__file__)
