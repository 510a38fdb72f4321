"""A batch overdue, named while it is late: which worker holds it, the sample indices it was
given (where known) and that worker's Python stack, for the engine's runs and for watched jobs
(a torchrun rank's included). The run goes on; the report becomes a diagnostic of the run
(analyse/overdue.py). A run that waits past the loader's ``timeout`` (the engine's --timeout-s)
ends in the hang error instead (child/failures.py), from the same ``where_stuck``.

NOTE [ When a batch is overdue ]

    The loop's usual time per batch is the median of wait + step over the batches of the last
    flush (the recorder's 0.25 s). A batch is overdue once the loop has waited for it
    SLOW_FACTOR times that, and at least SLOW_MIN_S (a collection pause or a checkpoint's hiccup
    is not a slow sample). An epoch's first batch carries its workers' start-up: it is overdue
    only after STARTUP_MIN_S, or SLOW_FACTOR times the last epoch's start-up. One report per
    batch, at most protocol.MAX_OVERDUE a run: past that the pattern is shown already, and
    each report asks the stuck workers for their stacks (up to a second each).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Sequence

import psutil

from dataloader_tuner import protocol
from dataloader_tuner.instrument import probes
from dataloader_tuner.instrument.fork_stuck import stuck_in_fork, stuck_in_fork_text
from dataloader_tuner.instrument.stacks import STACKS_ENV, main_thread_stack, worker_stack
from dataloader_tuner.record.ledger import BatchLedger

SLOW_FACTOR = 10.0
SLOW_MIN_S = 1.0
STARTUP_MIN_S = 20.0
MAX_STACKS = 4  # workers whose stacks one report reads
USUAL_SAMPLE = 256  # rows the usual time is read from, spread over the flush


def where_stuck(iterator: Any, stacks_dir: str | None) -> list[dict]:
    """The batches ``iterator`` was asked for and has not delivered, oldest first, each as
    ``{worker_id, indices, stack, pid}`` (indices where its batch sampler remembers them, a
    stack where the worker answers, the pid of a worker process; ``stuck_in_fork``, said,
    where its worker never started); at most MAX_STACKS workers asked."""
    outstanding = probes.outstanding(iterator)
    stacks: dict[int, str | None] = {}  # one per worker: several batches may wait on it
    in_fork: dict[int, bool] = {}  # likewise: NOTE [ A worker stuck inside fork() ]
    workers = getattr(iterator, "_workers", None) or []
    for entry in outstanding:
        worker = entry["worker_id"]
        if worker not in stacks and len(stacks) < MAX_STACKS:
            stacks[worker] = stack_of(iterator, worker, stacks_dir)
        entry["stack"] = stacks.get(worker)
        if 0 <= worker < len(workers):  # (a stack not read is still there for py-spy to read)
            entry["pid"] = workers[worker].pid
        if worker not in in_fork:  # (one that answered for its stack is not inside fork())
            in_fork[worker] = (entry["stack"] is None and 0 <= worker < len(workers)
                               and stuck_in_fork(workers[worker]))
        if in_fork[worker]:  # said in this process's words: its Python's, not the dashboard's
            entry["stuck_in_fork"] = stuck_in_fork_text()
    return outstanding


def stack_of(iterator: Any, worker_id: int, stacks_dir: str | None) -> str | None:
    """The stack of ``iterator``'s worker ``worker_id`` (-1: the main process, inside the fetch
    itself), or None where it cannot be read."""
    if worker_id < 0:
        return main_thread_stack()
    workers = getattr(iterator, "_workers", None) or []
    if stacks_dir is None or not 0 <= worker_id < len(workers):
        return None
    return worker_stack(stacks_dir, workers[worker_id].pid)


STACKS_PREFIX = "dataloader-tuner-stacks-"  # + the pid of the process whose workers use it
STALE_AFTER_S = 3600.0  # a folder whose process is gone, left this long: the pid is not reused


def new_stacks_folder() -> str:
    """A folder for this process's workers' stacks, named in the environment they inherit
    (STACKS_ENV), however they are started; made after removing those left behind by
    processes killed before they could (a SIGKILLed run, a killed job)."""
    tmp = tempfile.gettempdir()
    now = time.time()
    for name in os.listdir(tmp):  # (a shared /tmp may hold thousands: only ours are looked at)
        if not name.startswith(STACKS_PREFIX):
            continue
        pid = name[len(STACKS_PREFIX):].split("-")[0]
        path = os.path.join(tmp, name)
        try:
            if (pid.isdigit() and not psutil.pid_exists(int(pid))
                    and now - os.stat(path).st_mtime > STALE_AFTER_S):
                shutil.rmtree(path, ignore_errors=True)
        except OSError:  # gone meanwhile, or another user's
            pass
    folder = tempfile.mkdtemp(prefix=f"{STACKS_PREFIX}{os.getpid()}-")
    os.environ[STACKS_ENV] = folder
    return folder


def made_for_this_process() -> str | None:
    """The stacks folder new_stacks_folder made in this process, if any. One named in the
    environment by a parent (a rank started by rank 0, a job launched from a watched notebook)
    is the parent's: removed when the parent exits."""
    folder = os.environ.get(STACKS_ENV)
    if folder and os.path.basename(folder).startswith(f"{STACKS_PREFIX}{os.getpid()}-"):
        return folder
    return None


class StallWatch:
    """Run from a recorder's thread each flush: ``observe`` the flush's rows, then ``check``."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.usual_s: float | None = None
        self.reported_seq = -1
        self.reports = 0
        self.latest: protocol.Overdue | None = None  # the last report (a rank's report reads it)

    def observe(self, batch_seconds: Sequence[float]) -> None:
        """The usual time per batch, from batches about to be flushed (their wait and step:
        ``batch_seconds``; none: kept as it was)."""
        if batch_seconds:
            self.usual_s = statistics.median(batch_seconds)


    def overdue_after(self, ledger: BatchLedger) -> float | None:
        """Seconds in next() after which the batch asked for is overdue (None: not known yet)."""
        if ledger.opening:  # a loader's first batch: its workers' start-up too
            last = ledger.last_startup_s
            return max(STARTUP_MIN_S, SLOW_FACTOR * last if last is not None else 0.0)
        if self.usual_s is None:
            return None
        return max(SLOW_MIN_S, SLOW_FACTOR * self.usual_s)

    def check(self, ledger: BatchLedger | None, now: float,
              where: Callable[[], list[dict]]) -> protocol.Overdue | None:
        """An Overdue report when the loop has waited too long for the batch it asked for (once
        a batch); ``where()`` says who holds it (where_stuck)."""
        if ledger is None or self.reports >= protocol.MAX_OVERDUE:
            return None
        asking, seq = ledger.asking_since, ledger.seq
        if asking is None or seq <= self.reported_seq:
            return None
        limit = self.overdue_after(ledger)
        if limit is None or now - asking < limit:
            return None
        self.reported_seq = seq
        self.reports += 1
        try:
            outstanding = where()
        except Exception:  # noqa: BLE001 - the report goes out without its where
            outstanding = []
        self.latest = protocol.Overdue(seq, asking - self.t0, now - asking, self.usual_s,
                                       ledger.opening, outstanding)
        return self.latest
