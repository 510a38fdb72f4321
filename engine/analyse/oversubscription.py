"""Threads fighting over the cores: workers whose thread pools (BLAS, OpenMP, OpenCV, torch)
or the dataset's own threads keep more threads busy than there are usable CPUs (NOTE [ Threads
per worker ], instrument/threads.py), found from each worker's probe and its threads' use of
its CPU, as a diagnostic (thread_oversubscription) and for the tune's threads check
(tune/thread_pools.py)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.analyse.hotspots import TorchThreads

# A worker's threads other than its main one doing this share of its CPU: its pools work
# (NOTE [ Threads per worker ]: 0.5 with a 2-thread BLAS pool at work, under 0.2 limited).
HELPER_SHARE_MIN = 0.25
# A worker's thread that sends batches to the main process (its queue's feeder) did 70% of its
# CPU on batches of 0.1 ms of CPU, and most of it on a dataset that sleeps (0.3 ms of CPU in a
# 2.4 ms batch), 2% on 24 ms ones: below this CPU per batch its share says nothing.
CPU_MIN_MS = 2.0
POOL_NAMES = {"openblas": "OpenBLAS (numpy's BLAS)", "mkl": "MKL", "openmp": "OpenMP",
              "opencv": "OpenCV", "torch": "torch intra-op"}

THREADS_FIX = """import dataloader_tuner
# your own init, if any, then each worker's pools (torch, BLAS, OpenMP, OpenCV) to one thread:
DataLoader(dataset, ..., worker_init_fn=dataloader_tuner.LimitThreads(your_worker_init_fn))

# or without this package, in your worker_init_fn:
#   torch.set_num_threads(1); cv2.setNumThreads(1)
#   threadpoolctl.threadpool_limits(1)   # numpy's and scipy's BLAS, OpenMP"""
TORCH_RAISED = ("DataLoader sets torch's pool to one thread in each worker; your worker_init_fn "
                "or dataset raised it again.")
OTHERS_UNLIMITED = ("DataLoader sets torch's own pool to one thread in each worker, not the "
                    "pools of other libraries.")
OWN_THREADS_FIX = """# the workers already run in parallel: a thread pool of the
# dataset's own, in each of them, needs a thread or two, not one per core
pool = ThreadPoolExecutor(max_workers=1)"""


@dataclass(frozen=True)
class Oversubscribed:
    """Workers keeping more threads busy than there are CPUs (NOTE [ Threads per worker ],
    instrument/threads.py)."""

    busy_threads: int  # per worker
    helper_share: float  # of the workers' CPU, done by threads other than their main one
    pool: str | None  # the largest library pool in a worker with more than one thread
    pool_threads: int  # its size (1: none)

    def said(self, num_workers: int, cpus_usable: float) -> str:
        text = (f"each worker keeps {self.busy_threads} threads busy ({num_workers} workers: "
                f"{num_workers * self.busy_threads} threads on {cpus_usable:g} CPU(s)), its "
                f"threads other than the main one doing {self.helper_share:.0%} of its CPU")
        if self.pool is None:
            return (text + "; none of them a library pool this tool knows (BLAS, OpenMP, "
                    "OpenCV, torch): they look like threads your dataset starts itself")
        text += (f"; its {POOL_NAMES.get(self.pool, self.pool)} pool has {self.pool_threads} "
                 "threads")
        if self.busy_threads > self.pool_threads + 1:
            text += ("; the other busy ones look like threads your dataset starts itself")
        return text

    @property
    def limits_can_help(self) -> bool:
        """The busy threads are a library pool's, which LimitThreads sizes down (and not
        many more: threads the dataset starts itself it cannot)."""
        return self.pool is not None and self.busy_threads <= self.pool_threads + 1


def oversubscribed(pools: Sequence[dict[str, int]], uses: Sequence[tuple[float, int]],
                   num_workers: int, cpus_usable: float,
                   cpu_ms: float | None) -> Oversubscribed | None:
    """From each worker's pools (its probe) and its threads' use of its CPU ((share done by
    threads other than the main one, busy threads)): more busy threads than usable CPUs, with
    the other threads doing at least HELPER_SHARE_MIN of the work. Only where making a batch
    takes CPU_MIN_MS of CPU or more (``cpu_ms``, the median): on less the thread that sends
    batches to the main process does as much as the making."""
    if not num_workers or not uses or cpu_ms is None or cpu_ms < CPU_MIN_MS:
        return None
    share = statistics.median(u[0] for u in uses)
    busy = int(statistics.median(u[1] for u in uses))
    if share < HELPER_SHARE_MIN or num_workers * busy <= cpus_usable:
        return None
    sized = [(size, name) for sizes in pools for name, size in sizes.items() if size > 1]
    size, name = max(sized) if sized else (1, None)
    return Oversubscribed(busy, round(share, 2), name, size)


def _less_torchs(use: tuple[float, int], own: TorchThreads | None) -> tuple[float, int]:
    """A worker's (helper share, busy threads) without torch's own hand-off threads."""
    if own is None:
        return use
    return max(0.0, use[0] - own.cpu_share), max(1, use[1] - own.busy)


def thread_oversubscription(probes: Sequence[dict[str, Any]], resources: Sequence[dict[str, Any]],
                            num_workers: int, cpus_usable: float, cpu_ms: float | None,
                            torch_threads: Callable[[int], TorchThreads | None] = lambda pid: None
                            ) -> list[Diagnostic]:
    """``torch_threads``: a worker's own hand-off threads as its sampler saw them
    (hotspots.SampledProfile), taken out of its threads' use: on small batches its queue's
    feeder and resource sharer did ~20% of a worker's CPU, and more under load."""
    in_workers = [p["probe"] for p in probes if p["worker_id"] >= 0]
    pools = [probe.get("pools") or {} for probe in in_workers]
    latest: dict[int, tuple[float, int]] = {}  # worker pid -> its use since it started, last read
    for row in resources:
        if row["role"] == "worker" and row.get("helper_cpu_share") is not None:
            latest[row["pid"]] = (row["helper_cpu_share"], row.get("busy_threads") or 1)
    found = oversubscribed(pools, [_less_torchs(use, torch_threads(pid))
                                   for pid, use in latest.items()],
                           num_workers, cpus_usable, cpu_ms)
    if found is None:
        return []
    fix = ("Limit each worker to one thread per pool; tune measures whether it pays."
           if found.limits_can_help else "Give each worker's own thread pool 1 or 2 threads.")
    return [Diagnostic(
        "thread_oversubscription", "warning",
        f"Threads fight over the cores: {found.said(num_workers, cpus_usable)}. "
        f"{TORCH_RAISED if found.pool == 'torch' else OTHERS_UNLIMITED} {fix}",
        {"busy_threads_per_worker": found.busy_threads, "num_workers": num_workers,
         "cpus_usable": cpus_usable, "helper_cpu_share": found.helper_share,
         "pool": found.pool, "pool_threads": found.pool_threads,
         # OMP_NUM_THREADS and the like as the workers had them (they size the pools)
         "pool_env": next((p["pool_env"] for p in in_workers if p.get("pool_env")), {})},
        THREADS_FIX if found.limits_can_help else OWN_THREADS_FIX)]
