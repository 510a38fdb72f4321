"""The resource sampler finds this process's children (the DataLoader workers) and samples
them, however it lists them (the kernel's children files, or psutil's scan)."""

import os
import subprocess

import pytest

from dataloader_tuner.instrument.resources import ResourceSampler


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
