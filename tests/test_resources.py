"""The resource sampler finds this process's children (the DataLoader workers) and samples
them, however it lists them (the kernel's children files, or psutil's scan), and reads a
worker's threads' use from its first batch."""

import hashlib
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from dataloader_tuner.instrument import threads
from dataloader_tuner.instrument.resources import BusiestThread, ResourceSampler


@pytest.mark.parametrize("listing", ["kernel", "psutil"])
def test_children_are_found_and_sampled(listing, monkeypatch):
    child = subprocess.Popen(["sleep", "30"])
    try:
        sampler = ResourceSampler({child.pid: 0})
        if listing == "psutil":  # as on a kernel without /proc/PID/task/TID/children
            real = os.listdir

            def no_task_files(path="."):
                if "/task" in str(path):
                    raise FileNotFoundError(path)
                return real(path)

            monkeypatch.setattr(os, "listdir", no_task_files)
        assert child.pid in sampler._children()
        sampler.sample(0.0)  # primes the new child's CPU counter
        procs = {p["pid"]: p for p in sampler.sample(0.5).procs}
        assert procs[child.pid]["role"] == "worker" and procs[child.pid]["worker_id"] == 0
        assert procs[child.pid]["rss_mb"] > 0 and "main" in {p["role"] for p in procs.values()}
    finally:
        child.kill()
        child.wait()


# A start-up on the main thread (importing torch in a spawned worker), then a pool at work
STARTS_THEN_POOL = """
import sys, threading, time
def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
spin(0.6)
print("made a batch", flush=True)
threading.Thread(target=spin, args=(30,), daemon=True).start()
time.sleep(30)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread ids: Linux only")
def test_a_workers_thread_use_counts_from_its_first_batch_and_skips_other_children():
    """A spawned worker spends its start-up on its main thread: counted since it started, a
    pool doing all the work after it read as a share under HELPER_SHARE_MIN for a 4 s profile
    (0.20-0.22 where it was 0.50), and the resource tracker (no batches) counted as a worker."""
    worker = subprocess.Popen([sys.executable, "-c", STARTS_THEN_POOL], stdout=subprocess.PIPE,
                              text=True)
    other = subprocess.Popen(["sleep", "30"])
    try:
        worker_ids: dict[int, int] = {}
        sampler = ResourceSampler(worker_ids)
        assert worker.stdout is not None and worker.stdout.readline() == "made a batch\n"
        worker_ids[worker.pid] = 0  # as the ledger does when its first batch arrives
        sampler.sample(0.0)
        time.sleep(0.8)
        procs = {p["pid"]: p for p in sampler.sample(0.8).procs}
        assert procs[worker.pid]["helper_cpu_share"] > 0.9, procs[worker.pid]
        assert procs[other.pid]["helper_cpu_share"] is None
        since_start = threads.thread_use(psutil.Process(worker.pid))
        assert since_start is not None and since_start.helper_share < 0.8  # what it read before
    finally:
        for child in (worker, other):
            child.kill()
            child.wait()


@pytest.mark.host_speed  # a hashing thread's quarter of a core in 1 s
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread CPU: /proc (Linux)")
def test_the_busiest_thread_is_one_thread_where_the_process_counts_all():
    """Two threads hashing (hashlib lets go of the GIL) for 1.5 s: the process may read up to
    200% of a CPU, its busiest thread one CPU at most; a thread that did nothing reads 0."""
    proc = psutil.Process()
    busiest = BusiestThread(proc)
    proc.cpu_percent(None)
    until = time.monotonic() + 1.5

    def hash_until() -> None:
        data = b"x" * 2**20
        while time.monotonic() < until:
            hashlib.sha256(data).digest()

    workers = [threading.Thread(target=hash_until) for _ in range(2)]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # (read while they run: a thread that ended is no longer listed)
    one, whole = busiest.percent(), proc.cpu_percent(None)
    for worker in workers:
        worker.join()
    assert one is not None and 25 <= one <= 110, (one, whole)
    assert whole >= one - 5
    busiest.percent()
    time.sleep(0.3)
    assert busiest.percent() < 20  # (the threads ended: only this one's sleep is left)
