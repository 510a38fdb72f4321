"""The thread pools inside a process (torch's, BLAS's, OpenMP's, OpenCV's): how many threads each
may run, how much of a worker's CPU its extra threads do, and a worker_init_fn that limits each
pool to one thread.

NOTE [ Threads per worker ]

    DataLoader sets torch's own intra-op pool to one thread in every worker
    (torch/utils/data/_utils/worker.py), but not the pools of the libraries a dataset calls:
    numpy's OpenBLAS, MKL, OpenMP (libgomp, libomp) and OpenCV each start one thread per core
    in every worker, and a worker_init_fn that calls ``torch.set_num_threads(n)`` undoes
    torch's. W workers then run W x cores threads on the cores, and BLAS threads spin while
    they wait for each other. Measured on tests/datasets/blas_threads.py (a few 128x128
    matmuls per sample), 2 workers on 2 CPUs: 9-12 s an epoch with numpy's 2-thread pool
    against 1.4 s limited to one thread (6-8x; pytorch#82219, #19825 report up to 10x).

    Read in each process after its first fetch (the probe): each pool's size (``pools``). A
    pool can be large and idle (numpy imported, no BLAS called), so what says it works is the
    share of a worker's CPU done by its threads other than the main one (``thread_use``),
    since its first batch: 0.47-0.51 above with the 2-thread pool, 0.08-0.17 limited to one,
    0 for a pure-Python dataset. Counted since the worker started, a spawned worker's second of
    importing torch on its main thread read 0.20-0.22 for a 4 s profile of
    tests/datasets/torch_threads.py, where its pool does 0.50. Oversubscribed: a pool of P > 1
    threads in the workers, W x P above the usable CPUs, and helper threads doing at least
    HELPER_SHARE_MIN of the workers' CPU (analyse/oversubscription.py's ``oversubscribed``,
    read by the diagnostic and the tuner). The diagnostic first takes out torch's own threads, as each
    worker's sampler saw them (its queue's feeder, multiprocessing's resource sharer): on
    tests/broken/leaky_cache.py's 4-sample batches they did 0.24-0.26 of a worker's CPU and
    were read as OpenBLAS's pool at work.

    Limited by ``LimitThreads``, a worker_init_fn (the user's own runs before it, so one that
    raises torch's pool is overruled): torch's pool,
    every BLAS and OpenMP library already loaded, and OpenCV's, each set to one thread; the
    variables OMP_NUM_THREADS and the like set to 1 for libraries the worker loads later. The
    main process is left as it is: a training step on the CPU keeps its threads.

    Libraries are found in /proc/self/maps (Linux); elsewhere only torch's and OpenCV's pools
    are read and limited.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import psutil

from dataloader_tuner.instrument.worker_init import AfterYourInit, wraps_a

# Variables the libraries read when they load (for those a worker imports after its start).
POOL_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
            "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

# Library file name (a part of it) -> (pool name, getter symbols, setter symbols). OpenBLAS is
# built with a prefix and a suffix in numpy's and scipy's wheels (scipy_openblas...64_).
_LIBRARIES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("openblas", "openblas",
     ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
      "openblas_get_num_threads64_", "openblas_get_num_threads"),
     ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
      "openblas_set_num_threads64_", "openblas_set_num_threads")),
    ("libmkl_rt", "mkl", ("MKL_Get_Max_Threads",), ("MKL_Set_Num_Threads",)),
    ("libgomp", "openmp", ("omp_get_max_threads",), ("omp_set_num_threads",)),
    ("libomp", "openmp", ("omp_get_max_threads",), ("omp_set_num_threads",)),
    ("libiomp", "openmp", ("omp_get_max_threads",), ("omp_set_num_threads",)),
)


def _loaded_libraries() -> list[str]:
    """Paths of the shared libraries this process has loaded (Linux; [] elsewhere)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            paths = {line.split(None, 5)[-1].strip() for line in handle if ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def _library_calls(which: int) -> list[tuple[str, Callable[..., int]]]:
    """(pool name, function) for each loaded pool library: its getter (which=0) or setter (1).
    The libraries are opened without loading anything new (RTLD_NOLOAD)."""
    found = []
    for path in _loaded_libraries():
        name = os.path.basename(path)
        for part, pool, getters, setters in _LIBRARIES:
            if part not in name:
                continue
            try:
                library = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))
            except OSError:
                break
            for symbol in (getters, setters)[which]:
                if hasattr(library, symbol):
                    found.append((pool, getattr(library, symbol)))
                    break
            break
    return found


def pools() -> dict[str, int]:
    """Threads each pool of this process may run: ``{"torch": 1, "openblas": 8, ...}``."""
    sizes: dict[str, int] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        sizes["torch"] = int(torch.get_num_threads())
    for pool, getter in _library_calls(0):
        try:
            sizes[pool] = max(sizes.get(pool, 0), int(getter()))
        except Exception:  # noqa: BLE001 - a library that will not say is left out
            pass
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "getNumThreads"):
        sizes["opencv"] = int(cv2.getNumThreads())
    return sizes


def pool_env() -> dict[str, str]:
    """The thread variables set in this process's environment."""
    return {key: os.environ[key] for key in POOL_ENV if key in os.environ}


def limit_to_one() -> None:
    """Every pool of this process to one thread (see the NOTE)."""
    for key in POOL_ENV:
        os.environ[key] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    for _pool, setter in _library_calls(1):
        try:
            setter(1)
        except Exception:  # noqa: BLE001 - a library that refuses keeps its pool
            pass
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(1)


class LimitThreads(AfterYourInit):
    """A worker_init_fn that runs ``init_fn`` (yours, if any), then limits each thread pool of
    the worker to one thread: ``DataLoader(ds, num_workers=8,
    worker_init_fn=LimitThreads(your_init_fn))``. The tuner recommends it where it measured it
    faster (NOTE [ Threads per worker ]); yours runs first, so one that raises torch's pool is
    overruled."""

    def then(self) -> None:
        limit_to_one()


def limits_threads(init_fn: Any) -> bool:
    """Whether a worker_init_fn (maybe wrapped by the probes) is LimitThreads."""
    return wraps_a(init_fn, LimitThreads)


@dataclass(frozen=True)
class ThreadUse:
    """How a process's threads shared its CPU since it started, or since a reading of their
    times (``thread_times``)."""

    helper_share: float  # done by its threads other than the main one
    busy_threads: int  # threads that did at least BUSY_SHARE of its CPU each


# One of 8 threads of a pool doing half a worker's CPU did 6-7% each; the worker's result
# queue feeder, pickling batches, 2-3%.
BUSY_SHARE = 0.05


def thread_times(process: psutil.Process) -> dict[int, float] | None:
    """Each thread's CPU seconds so far, by thread id; None where they cannot be read, and off
    Linux (where a thread's id is not its process's for the main thread)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        threads = process.threads()
    except (psutil.Error, OSError):
        return None
    return {t.id: t.user_time + t.system_time for t in threads}


def thread_use(process: psutil.Process,
               since: Mapping[int, float] | None = None) -> ThreadUse | None:
    """Since ``since`` (thread_times read earlier), else since the process started. None when
    the threads cannot be read or have barely run since."""
    now = thread_times(process)
    if now is None:
        return None
    before = since or {}
    times = {tid: cpu - before.get(tid, 0.0) for tid, cpu in now.items()}
    total = sum(times.values())
    if total < 0.05:  # too little CPU to tell a pool from a blip
        return None
    others = sum(cpu for tid, cpu in times.items() if tid != process.pid)
    return ThreadUse(round(others / total, 3),
                     sum(1 for cpu in times.values() if cpu >= BUSY_SHARE * total))


class ThreadsSinceFirstBatch:
    """Each worker's threads' use counted from the first batch it made: a spawned worker's
    start-up (a second of importing torch on its main thread) is not its pool's work."""

    def __init__(self) -> None:
        self._from: dict[int, dict[int, float]] = {}  # pid -> its threads' CPU times by then

    def started(self, pid: int) -> bool:
        return pid in self._from

    def start(self, pid: int) -> None:
        """Called once the worker has made its first batch; later calls keep the first."""
        if pid not in self._from:
            try:
                self._from[pid] = thread_times(psutil.Process(pid)) or {}
            except psutil.Error:
                pass

    def use(self, pid: int) -> ThreadUse | None:
        """Since ``start(pid)``; None before it, or where the threads cannot be read."""
        since = self._from.get(pid)
        if since is None:
            return None
        try:
            return thread_use(psutil.Process(pid), since)
        except psutil.Error:
            return None

    def forget(self, pid: int) -> None:
        self._from.pop(pid, None)
