"""A snapshot of the machine the loader runs on: CPUs, RAM, /dev/shm, GPU.

``SystemSnapshot`` is the one reading of it: the tuner's CPU budget, the diagnostics' CPU count
and the dashboard's panel all ask it (``cores``, ``cpu_budget``), so a cgroup quota
(``docker --cpus=2`` on 16 cores) counts everywhere or nowhere. Importing this module costs no
torch: the parent side reads snapshots; whoever takes one (the child, a watched job) asks
torch for the GPU and passes it in.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable

import psutil

MB = 1024 * 1024


@dataclass(frozen=True)
class SystemSnapshot:
    cpus_logical: int
    cpus_usable: int  # affinity: taskset, a cgroup cpuset
    cpu_quota: float | None  # cgroup v2 quota in cores; None: unlimited or unknown
    other_load_cpus: float  # cores' worth of other processes' load when the run started
    ram_total_mb: float
    ram_available_mb: float
    shm: dict | None  # /dev/shm {total_mb, used_mb, free_mb}
    gpu: dict  # gpu.gpu_info(): {"available": bool, "reason", "name", ...}

    @property
    def cores(self) -> float:
        """The CPUs this process can use: its affinity, capped by a cgroup quota."""
        return min(self.cpus_usable, self.cpu_quota) if self.cpu_quota else self.cpus_usable

    def cpu_budget(self, local_world_size: int = 1) -> float:
        """Cores left for one loader: ``cores`` less other load, shared by the loaders of
        ``local_world_size`` ranks on this machine (at least half a core)."""
        return max((self.cores - self.other_load_cpus) / max(local_world_size, 1), 0.5)

    @property
    def gpu_available(self) -> bool:
        return bool(self.gpu.get("available"))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> "SystemSnapshot":
        """Tolerant of runs stored before a field existed (a neutral value instead)."""
        usable = doc.get("cpus_usable") or 1
        return cls(cpus_logical=doc.get("cpus_logical") or usable, cpus_usable=usable,
                   cpu_quota=doc.get("cpu_quota"),
                   other_load_cpus=doc.get("other_load_cpus") or 0.0,
                   ram_total_mb=doc.get("ram_total_mb") or 0.0,
                   ram_available_mb=doc.get("ram_available_mb") or 0.0,
                   shm=doc.get("shm"), gpu=doc.get("gpu") or {
                       "available": False, "reason": "not recorded with this run"})


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


# How long the machine's other load is watched for a snapshot (a module value: tests lengthen it).
LOAD_INTERVAL_S = 0.2
MIN_LOAD_INTERVAL_S = 0.05  # shorter, and the CPU counters' 10 ms ticks are the reading


def other_processes_cpu(interval_s: float = LOAD_INTERVAL_S,
                        wait: Callable[[float], object] = time.sleep) -> float:
    """CPU cores' worth of load from processes other than this one and its children, over
    ``interval_s``: the machine's CPU time minus ours in the same interval. ``wait(seconds)``
    may return early (a watched run that ends meanwhile): the load is then over the time
    waited, or 0.0 (not measured) where that was too short to read."""
    me = psutil.Process()
    own = [me] + me.children(recursive=True)
    before = _cpu_seconds(own)
    psutil.cpu_percent(interval=None)  # primes the machine-wide counter
    started = time.monotonic()
    wait(interval_s)
    waited_s = time.monotonic() - started
    if waited_s < MIN_LOAD_INTERVAL_S:  # the kernel counts CPU time in 10 ms ticks
        return 0.0  # not measured, as a snapshot without it reads
    total_percent = psutil.cpu_percent(interval=None) * psutil.cpu_count()
    mine = sum(_cpu_seconds(own).get(p, 0.0) - s for p, s in before.items()) / waited_s
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


# Rehearse a smaller /dev/shm than this machine's (a container's 64 MB default) before
# deploying there: the checks and the tuner take this many MB as its size.
SHM_MB_ENV = "DATALOADER_TUNER_SHM_MB"


def shm_usage() -> dict | None:
    """Size and use of /dev/shm, where worker batches travel to the main process (as large as
    SHM_MB_ENV says, when set)."""
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return None
    total, used = usage.total / MB, usage.used / MB
    rehearsed = False
    try:
        total, rehearsed = float(os.environ[SHM_MB_ENV]), True
        used = min(used, total)
    except (KeyError, ValueError):
        pass  # not set, or not a number: the real size
    return {"total_mb": total, "used_mb": used, "free_mb": total - used, "rehearsed": rehearsed}


def snapshot(gpu: dict, wait: Callable[[float], object] = time.sleep) -> SystemSnapshot:
    """Everything the tuner and the user need to judge what the machine can give the loader:
    ``gpu`` as the caller found it (``instrument.gpu.gpu_info()``, which needs torch), ``wait``
    as other_processes_cpu's."""
    memory = psutil.virtual_memory()
    return SystemSnapshot(
        cpus_logical=psutil.cpu_count(logical=True),
        cpus_usable=usable_cpus(),
        cpu_quota=cpu_quota(),
        other_load_cpus=round(other_processes_cpu(LOAD_INTERVAL_S, wait), 2),
        ram_total_mb=memory.total / MB,
        ram_available_mb=memory.available / MB,
        shm=shm_usage(),
        gpu=gpu,
    )
