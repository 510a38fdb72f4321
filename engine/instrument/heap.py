"""Memory a worker frees: kept in the worker's heap for its next batch, or given back to the
system and faulted in again, and a worker_init_fn that keeps it.

NOTE [ Memory a worker frees ]

    glibc's malloc serves a block above its mmap threshold (128 KiB at start) with a fresh
    mapping and unmaps it when freed, and gives the heap's free top back above its trim
    threshold: the next batch's arrays are then page-faulted in and zeroed again. Freeing such
    a block raises both thresholds (up to 32 MiB), once for the whole process, and a forked
    worker inherits them. So a worker is fast or slow by what its parent freed before
    ``iter(loader)`` forked it: measured on tests/real/audio_mel.py (numpy/torch arrays of
    0.1-2 MB a sample), 2 persistent workers, loading only: 298 samples/s and ~70,000 page
    faults a batch in each worker when the parent had freed nothing large, 451 and ~400
    when it had (a 16 MB tensor freed before the loader). With a training step: 164 against
    216-222 samples/s. Workers restarted each epoch fork from a parent that has run the step
    by then, so they are the fast ones: persistent workers measured slower than restarted
    ones on that dataset for this reason alone. A JPEG pipeline (PIL's own allocator) and a
    pure-Python one showed no difference (592 against 601, 974 against 1000).

    ``KeepFreedMemory``, a worker_init_fn, sets both thresholds in each worker (mmap 32 MiB,
    the most glibc allows, trim 64 MiB): 472 samples/s from a parent that had freed nothing,
    452 from one that had, workers' memory +6 MB each. The cost is at most the trim threshold
    of freed memory a worker keeps. Elsewhere (musl, macOS, Windows) it does nothing.

    The tune decides it by measuring, at its first trial with workers, workers started fresh
    (spawned: their heap as a script's process has it before its first epoch) against the
    same count with it (tune/heap_check.py), by their rates and by the pages their workers
    fault in a batch (``FaultsSinceFirstBatch``): on audio_mel, 2 persistent workers, loading
    only, forked from a parent that had freed nothing 134,000 a batch, spawned 130,000, with
    it 720, where the rates of the same runs (217-381 against 322-455 samples/s) overlapped
    from one process to the next on a busy 2-core machine.
"""

from __future__ import annotations

import ctypes
import platform
from typing import Any

from dataloader_tuner.instrument.worker_init import AfterYourInit, wraps_a

# mallopt's parameters (malloc.h) and the values KeepFreedMemory sets.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024  # twice the mmap threshold, as glibc's own raise does


def is_glibc() -> bool:
    """Whether this process's C library is glibc (the only one KeepFreedMemory tunes)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory() -> bool:
    """Raise this process's malloc thresholds (see the NOTE); False where it cannot."""
    if not is_glibc():
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library already loaded: no lookup at each worker start
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                    and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


class KeepFreedMemory(AfterYourInit):
    """A worker_init_fn that runs ``init_fn`` (yours, if any), then keeps the memory the worker
    frees for its next batch: ``DataLoader(ds, num_workers=4,
    worker_init_fn=KeepFreedMemory(your_init_fn))`` (NOTE [ Memory a worker frees ])."""

    def then(self) -> None:
        keep_freed_memory()


def keeps_freed_memory(init_fn: Any) -> bool:
    """Whether a worker_init_fn (maybe wrapped by the probes or LimitThreads) keeps it."""
    return wraps_a(init_fn, KeepFreedMemory)


def minor_faults(pid: int) -> int | None:
    """The pages process ``pid`` has faulted in without reading a disk (Linux's minflt);
    None where it cannot be read (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)", which may hold spaces
        return int(fields[7])  # the 10th field of proc(5): minflt
    except (OSError, IndexError, ValueError):
        return None


class FaultsSinceFirstBatch:
    """The pages a trial's workers fault in, counted from the first batch each made: a spawned
    worker's imports are not its batches' work (NOTE [ Memory a worker frees ])."""

    def __init__(self) -> None:
        self._from: dict[int, int] = {}  # pid -> its minflt by its first batch

    def start(self, pid: int) -> None:
        """Called once the worker has made its first batch; later calls keep the first."""
        if pid not in self._from and (faults := minor_faults(pid)) is not None:
            self._from[pid] = faults

    def per_batch(self, batches: int) -> float | None:
        """Faults in all the workers since each started, per batch of ``batches`` made in that
        time; None where no worker could be read throughout."""
        now = {pid: minor_faults(pid) for pid in self._from}
        read = [faults - self._from[pid] for pid, faults in now.items() if faults is not None]
        return sum(read) / batches if read and batches > 0 else None
