"""A snapshot of the machine the loader runs on: CPUs, RAM, /dev/shm, GPU."""

from __future__ import annotations

import os
import shutil
import time

import psutil

from . import gpu

MB = 1024 * 1024


def usable_cpus() -> int:
    """CPUs this process may run on (affinity, e.g. taskset or a cgroup cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_quota() -> float | None:
    """The cgroup v2 CPU quota in cores (docker --cpus), or None when unlimited/unknown."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as handle:
            quota, period = handle.read().split()
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def other_processes_cpu(interval_s: float = 0.2) -> float:
    """CPU cores' worth of load from processes other than this one and its children, over
    ``interval_s``: the machine's CPU time minus ours in the same interval."""
    me = psutil.Process()
    own = [me] + me.children(recursive=True)
    before = _cpu_seconds(own)
    psutil.cpu_percent(interval=None)  # primes the machine-wide counter
    time.sleep(interval_s)
    total_percent = psutil.cpu_percent(interval=None) * psutil.cpu_count()
    mine = sum(_cpu_seconds(own).get(p, 0.0) - s for p, s in before.items()) / interval_s
    return max(total_percent / 100.0 - mine, 0.0)


def _cpu_seconds(procs: list) -> dict:
    seconds = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            seconds[proc] = times.user + times.system
        except psutil.Error:
            pass
    return seconds


def shm_usage() -> dict | None:
    """Size and use of /dev/shm, where worker batches travel to the main process."""
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return None
    return {"total_mb": usage.total / MB, "used_mb": usage.used / MB, "free_mb": usage.free / MB}


def snapshot(load_interval_s: float = 0.2) -> dict:
    """Everything the tuner and the user need to judge what the machine can give the loader."""
    memory = psutil.virtual_memory()
    return {
        "cpus_logical": psutil.cpu_count(logical=True),
        "cpus_usable": usable_cpus(),
        "cpu_quota": cpu_quota(),
        "other_load_cpus": round(other_processes_cpu(load_interval_s), 2),
        "ram_total_mb": memory.total / MB,
        "ram_available_mb": memory.available / MB,
        "shm": shm_usage(),
        "gpu": gpu.describe(),
    }
