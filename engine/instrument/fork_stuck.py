"""A DataLoader worker that never started: forked, and still inside ``fork()``.

NOTE [ A worker stuck inside fork() ]

    On Python before 3.11.10 (and 3.10.15, 3.9.20), a process forked while another thread is
    making a Python thread state without holding the GIL deadlocks in the child, inside
    ``os.fork()`` itself, on the interpreter's lock of thread states (CPython gh-112275).
    torch.distributed's gloo threads do exactly that as each collective's work ends (a tensor
    given back to Python takes the GIL from a thread that has no thread state). So a rank that
    forks an epoch's DataLoader workers just after a collective can leave a worker that never
    runs: it holds the next batch's indices, the loop waits on it forever, and its process is
    alive, so torch's own check for dead workers never fires. Measured here: a Lightning DDP
    fit (2 ranks on gloo, 2 workers) hung in 2 of ~170 runs of 2 epochs and 1 of 14 of 25, a
    worker found in ``_PyThreadState_DeleteExcept`` under ``os.fork``.

    torch names a worker ``pt_data_worker`` first thing in its worker loop: a forked worker
    that still has its parent's name seconds after it was made never got there.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from typing import Any

import psutil

INSIDE_FORK = "inside fork()"
STUCK_AFTER_S = 5.0  # a forked worker reaches the worker loop in milliseconds
WORKER_NAME = "pt_data_worker"
FIXED_IN = {(3, 8): 20, (3, 9): 20, (3, 10): 15, (3, 11): 10}  # patch releases with the fix


def python_has_the_fork_bug(version: tuple = tuple(sys.version_info[:3])) -> bool:
    """Whether this Python can deadlock a child in fork() (gh-112275; 3.12 never could)."""
    fixed = FIXED_IN.get(version[:2])
    return fixed is not None and version[2] < fixed


@functools.lru_cache(maxsize=1)
def torch_names_its_workers() -> bool:
    """Whether this torch's worker loop names its process (torch 2.3 and later)."""
    try:
        from torch.utils.data._utils import worker
        return WORKER_NAME in inspect.getsource(worker._worker_loop)
    except (ImportError, OSError, TypeError, AttributeError):  # no source installed
        return False


def stuck_in_fork(worker: Any, after_s: float | None = None) -> bool:
    """Whether ``worker`` (a loader iterator's ``multiprocessing.Process``, a child of this
    process) was forked over ``after_s`` (STUCK_AFTER_S) seconds ago and has not reached torch's
    worker loop: NOTE above. False where it cannot be told: spawn and forkserver workers import
    torch first (seconds), and outside Linux a process's name is not read from its thread's."""
    popen = getattr(worker, "_popen", None)  # (a default-context worker's _start_method is None)
    if (getattr(popen, "method", None) != "fork" or not sys.platform.startswith("linux")
            or not torch_names_its_workers()):
        return False
    try:
        process = psutil.Process(worker.pid)
        return (process.ppid() == os.getpid()  # (not another process given its pid since)
                and process.name() != WORKER_NAME
                and process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
                and time.time() - process.create_time()
                > (STUCK_AFTER_S if after_s is None else after_s))
    except (psutil.Error, ValueError):  # gone meanwhile
        return False


def stuck_in_fork_text() -> str:
    """Where such a worker is, said in a report's line."""
    cause = (" (Python before 3.11.10 can deadlock there while another thread, such as "
             "torch.distributed's gloo threads, starts using Python: CPython gh-112275)"
             if python_has_the_fork_bug() else "")
    return f"{INSIDE_FORK}: it never started{cause}"


FORK_STUCK_FIX = ("# A worker stuck inside fork(): Python 3.11.10 or later (3.10.15, 3.9.20)\n"
                  "# fixes CPython gh-112275; or start the workers without fork:\n"
                  "DataLoader(..., multiprocessing_context=\"forkserver\")")
