"""A snapshot of the machine the loader runs on: CPUs, RAM, /dev/shm, GPU."""

from __future__ import annotations

import os
import shutil

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
    """CPU cores' worth of load from processes other than this one and its children."""
    own = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
    total_percent = psutil.cpu_percent(interval=interval_s) * psutil.cpu_count()
    mine = 0.0
    for pid in own:
        try:
            mine += psutil.Process(pid).cpu_percent(interval=None)
        except psutil.Error:
            pass
    return max(total_percent - mine, 0.0) / 100.0


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
