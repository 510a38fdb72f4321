"""Streams a watched loader's measurements into the run history from a background thread.

The training thread only appends: batch rows to ``rows``, the rare event (an epoch began, a
worker was first seen) to ``events``. Every FLUSH_S this thread takes what has accumulated and
writes it to SQLite as the engine's own runs are written (the same events, the same tables), with
a resource sample every RESOURCES_EVERY flushes and a heartbeat. So a job killed outright leaves
its run readable up to the last flush, and the history marks it "lost" once its process is gone
(RunStore.mark_lost_runs). Nothing here may stop training: a failure to write is reported once
on stderr and the job goes on.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import replace
from typing import Callable

from dataloader_tuner import protocol
from dataloader_tuner.analyse.results import ProfileResult
from dataloader_tuner.instrument.resources import ResourceSampler
from dataloader_tuner.record.ledger import BatchLedger, GapEvents
from dataloader_tuner.run.live import LiveRun
from dataloader_tuner.store import RunStore

FLUSH_S = 0.25
RESOURCES_EVERY = 2  # flushes: a resource sample every 0.5 s, as in the engine's runs
# The final result covers at most this many recent batches (a week-long job makes millions);
# every batch is still written to the history.
KEPT_BATCHES = 100_000
MAX_BACKLOG = 100_000  # rows kept for a retry while the history cannot be written
RECENT_ROWS = 2000  # the rows a rank's report to its job is figured from (job_report.py)


class Recorder:
    def __init__(self, store: RunStore, run_id: int, t0: float,
                 gaps: GapEvents | None = None) -> None:
        self.store, self.run_id, self.t0 = store, run_id, t0
        self.rows: list = []  # appended by the training thread, taken by the flush
        self.events: list = []
        self.gaps: list = []  # (seq, GPU idle ms), resolved after their batch (gpu_events.py)
        # The training thread's per-batch bookkeeping: its rows, epochs and workers come here.
        self.ledger = BatchLedger(t0, self._epoch_began, self._worker_seen, gaps, self.gaps)
        self.copies: list = []  # (seq, copy ms, other kind ms), from loader.to (gpu_events.py)
        self.tune_requested = False  # the dashboard's "Tune this job", seen at a flush
        self._written_seq = -1  # the last batch row written: a gap waits for its row
        self.worker_ids: dict[int, int] = {}  # pid -> DataLoader worker id, as batches show
        self.recent: deque = deque(maxlen=RECENT_ROWS)  # rows written, the newest last
        self.last_resources: protocol.Resources | None = None
        self.result: ProfileResult | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one flush at a time (the thread's, or finish's)
        self._failed = False
        self._sampler: ResourceSampler | None = None
        self._thread = threading.Thread(target=self._loop, name="dataloader-tuner-watch",
                                        daemon=True)

    def start(self, make_ready: Callable[[], protocol.Ready]) -> "Recorder":
        """``make_ready`` runs on the thread: reading the machine takes ~0.2 s, not the job's."""
        self._make_ready = make_ready
        self._thread.start()
        return self

    # -- called by the ledger, in the training thread: appends only ----------------------------

    def _epoch_began(self, epoch: int, start: float, startup_s: float) -> None:
        self.events.append(protocol.Epoch(epoch, start, startup_s))

    def _worker_seen(self, pid: int, worker_id: int, probe: dict | None) -> None:
        self.worker_ids[pid] = worker_id
        if probe is not None:
            self.events.append(protocol.Probe(pid, worker_id, probe))

    # -- the background thread ----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            with self._lock:
                self.store.record_event(self.run_id, self._make_ready())
        except Exception:  # noqa: BLE001
            self._report_failure()
        flushes = 0
        while not self._stop.wait(FLUSH_S):
            flushes += 1
            self.flush(sample=flushes % RESOURCES_EVERY == 0)

    def flush(self, sample: bool = False) -> None:
        with self._lock:
            try:
                # Taken from the buffers only once written: a failed write (the history file
                # locked, a full disk) is retried at the next flush, up to MAX_BACKLOG rows.
                events = self.events[:]
                rows = self.rows[:]
                for event in events:
                    self.store.record_event(self.run_id, event)
                del self.events[:len(events)]
                if rows:
                    self.store.record_event(self.run_id, protocol.Batches(rows))
                    del self.rows[:len(rows)]
                    self._written_seq = rows[-1][0]
                    self.recent.extend(rows)
                if sample:
                    self.last_resources = self._resources()
                    self.store.record_event(self.run_id, self.last_resources)
                self._write_gaps()
                self.store.heartbeat(self.run_id)
                if not self.tune_requested:
                    self.tune_requested = self.store.tune_requested(self.run_id)
            except Exception:  # noqa: BLE001 - never the training job's problem
                self._report_failure()
                if len(self.rows) > MAX_BACKLOG:  # a history that stays unwritable
                    del self.rows[:len(self.rows) - MAX_BACKLOG]

    def _write_gaps(self) -> None:
        """GPU timings resolved after their batches: written once their rows are."""
        for pending, write in ((self.gaps, self.store.set_gpu_gaps),
                               (self.copies, self.store.set_copy_times)):
            ready = [item for item in pending[:] if item[0] <= self._written_seq]
            if ready:
                write(self.run_id, ready)
                for item in ready:
                    pending.remove(item)

    def _resources(self) -> protocol.Resources:
        if self._sampler is None:
            self._sampler = ResourceSampler(self.worker_ids)  # primes the CPU counters
        sample = self._sampler.sample(time.monotonic() - self.t0)
        # Only this loader's workers: the job's other children (another loader's workers, a
        # logger) belong to other runs or none.
        mine = [p for p in sample.procs if p["role"] == "main" or p["pid"] in self.worker_ids]
        return replace(sample, procs=mine)

    def _report_failure(self) -> None:
        if not self._failed:
            self._failed = True
            sys.stderr.write("[dataloader-tuner] could not write the watched run to "
                             f"{self.store.path}; training goes on unrecorded:\n"
                             + traceback.format_exc())

    # -- the end --------------------------------------------------------------------------------

    def finish(self, status: str, error: dict | None = None) -> ProfileResult | None:
        """Write what is left, end the run and return its result (once; later calls return
        the same result)."""
        if self.result is not None or self._stop.is_set():
            return self.result
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self.flush(sample=True)
        try:
            elapsed = time.monotonic() - self.t0
            self.store.record_event(self.run_id, protocol.Finished(
                "error" if status == "error" else "done", elapsed))
            # Summarised from what was written (not kept in memory while training): the
            # training thread never pays for the summary's bookkeeping.
            live = LiveRun.stored(self.store, self.run_id, KEPT_BATCHES)
            result = replace(live.summary(status), error=error, run_id=self.run_id)
            self.store.finish_run(self.run_id, status, result, error)
            self.result = result
        except Exception:  # noqa: BLE001
            self._report_failure()
        return self.result


def process_identity() -> dict:
    """Who is training: for the history's list of watched jobs."""
    return {"pid": os.getpid(), "script": os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0]
            else "<interactive>"}
