"""Takes batch rows and rare events from the measuring thread and writes them to a sink from a
background thread: the engine child's (to its parent's pipe) and a watched loader's (to the run
history) are this one recorder with different sinks (run/sinks.py).

The measuring thread only appends: batches as a watched loop took them to ``taken`` (their
rows built here, NOTE [ A watched batch's row built off the job's thread ]), the rare event
(an epoch began, a worker was first seen, a trial) to ``events``, GPU timings resolved after
their batch to ``gaps``/``copies``. Every FLUSH_S the thread writes what has accumulated, with
a resource sample every RESOURCES_EVERY flushes. Nothing here may stop the measuring: a write
that fails is reported once on stderr, its events are kept for the next flush, and rows beyond
MAX_BACKLOG are dropped, oldest first, while the sink stays unwritable.

One thread waking every FLUSH_S (and at once where a watched epoch ran out: NOTE [ Runs ended
without a word ], run/settle.py), which also runs the owner's ``on_tick`` (the child's
watchdog), not one per duty: with the cores saturated by workers, each extra wake-up of this
process delays the main thread handing out indices, which costs the pipeline more than the
wake-up's own CPU time.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import replace
from typing import Callable

from dataloader_tuner import protocol
from dataloader_tuner.instrument.resources import ResourceSampler
from dataloader_tuner.record.columns import BatchColumns
from dataloader_tuner.record.ledger import BatchLedger, GapEvents
from dataloader_tuner.record.taken import TakenBatch, TakenForm, rows_of_taken
from dataloader_tuner.record.folding import Thinner
from dataloader_tuner.record.windows import BatchWindow
from dataloader_tuner.run.sinks import Sink

FLUSH_S = 0.25  # rows reach their sink at least this often
RESOURCES_EVERY = 2  # flushes: a resource sample every 0.5 s
MAX_BACKLOG = 100_000  # rows kept for a retry while the sink cannot be written
RECENT_ROWS = 2000  # the rows a rank's report to its job is figured from (job_report.py)


class Wakes:
    """What wakes the writer thread before FLUSH_S is up: the run's end (``stop``), or an
    epoch's (``soon``: write now, nothing held back)."""

    def __init__(self) -> None:
        self.stop, self.soon = threading.Event(), threading.Event()


class Recorder:
    def __init__(self, sink: Sink, t0: float, gaps: GapEvents | None = None,
                 in_job: bool = False, keep_recent: bool = False,
                 windows_after: int | None = None) -> None:
        """``in_job``: this process is a user's training job, not the engine's own: resource
        samples keep the main process and the workers this loader's batches came from (the
        job's other children belong to other runs), and reading the workers' private memory
        keeps to a watched job's share of a core (resources.py);
        ``keep_recent``: the last RECENT_ROWS rows written stay in ``recent`` (a rank's
        report to its job is figured from them); ``windows_after``: fast batches numbered
        from this on are written in windows (NOTE [ Windows for fast loaders ]; None: every
        row as it is)."""
        self.sink, self.t0 = sink, t0
        self.in_job = in_job
        self.taken: list[TakenBatch] = []  # appended by the measuring thread, taken by flush
        # ...or, for the engine's own loop, its batches in columns (record/columns.py)
        self.columns: BatchColumns | None = None
        self.events: list = []
        self.gaps: list = []  # (seq, GPU idle ms), resolved after their batch (gpu_events.py)
        self.copies: list = []  # (seq, copy ms, other kind ms), from loader.to (gpu_events.py)
        # The measuring thread's per-batch bookkeeping: its rows, epochs and workers come here.
        self.ledger = BatchLedger(t0, self.epoch_began, self.worker_seen, gaps, self.gaps)
        self.ledger.on_profile = self.profiled
        self.worker_ids: dict[int, int] = {}  # pid -> DataLoader worker id, as batches show
        self.probed_workers: list[int] = []  # the worker id of each probe, in arrival order
        # Batches written as taken, the newest last (only where read: a rank's report, which
        # builds their rows, job_report.py; the engine's fast path keeps none).
        self.recent: deque[TakenBatch] | None = (deque(maxlen=RECENT_ROWS) if keep_recent
                                                 else None)
        self.last_resources: protocol.Resources | None = None
        self.streaming = True  # False: the thread runs on_tick only (a tune sends its trials)
        self.windowed = (WindowedRows(windows_after, t0) if windows_after is not None
                         else None)
        self._written_seq = -1  # the last batch row written: a late timing waits for its row
        self._wakes = Wakes()
        self._lock = threading.Lock()  # one flush at a time (the thread's, or stop's)
        self._failed = False
        self._sampler: ResourceSampler | None = None
        self._thread: threading.Thread | None = None  # the writer, once started

    def start(self, first: Callable[[], protocol.Event] | None = None,
              on_tick: Callable[[], bool] | None = None) -> "Recorder":
        """``first`` runs on the thread and is written before anything else (reading the
        machine for a Ready takes ~0.2 s, not the job's); ``on_tick()`` runs before each flush,
        and returning True ends the thread (the child's watchdog fired)."""
        self._thread = threading.Thread(target=self._loop, args=(first, on_tick),
                                        name="dataloader-tuner-recorder", daemon=True)
        self._thread.start()
        return self

    # -- called by a ledger, in the measuring thread: appends only ----------------------------

    def epoch_began(self, epoch: int, start: float, startup_s: float) -> None:
        self.events.append(protocol.Epoch(epoch, start, startup_s))

    def epoch_ended(self, epoch: int) -> None:
        """The epoch ran out: said, and everything written at once by the thread, woken (the
        job's process may be ended next, without exit handlers: NOTE [ Runs ended without a
        word ], run/settle.py). Not written here: a SIGTERM handler ending the run on this
        thread in the middle of that write would wait for the write's lock forever."""
        self.events.append(protocol.EpochEnded(epoch, time.monotonic() - self.t0,
                                               self.ledger.seq))
        self._wakes.soon.set()

    def profiled(self, pid: int, worker_id: int, sampled: list) -> None:
        self.events.append(protocol.Profiled(pid, worker_id, sampled))

    def worker_seen(self, pid: int, worker_id: int, probe: dict | None) -> None:
        self.worker_ids[pid] = worker_id
        if probe is not None:
            self.events.append(protocol.Probe(pid, worker_id, probe))
            self.probed_workers.append(worker_id)

    # -- the background thread ----------------------------------------------------------------

    def _loop(self, first: Callable[[], protocol.Event] | None,
              on_tick: Callable[[], bool] | None) -> None:
        if first is not None:
            try:
                with self._lock:
                    self.sink.write([first()])
            except Exception:  # noqa: BLE001
                self.report_failure()
        flushes = 0
        while True:
            self._wakes.soon.wait(FLUSH_S)
            if self._wakes.stop.is_set():
                return
            # (cleared only when read set: one set after the read wakes the next round)
            everything = self._wakes.soon.is_set()
            if everything:
                self._wakes.soon.clear()
            if on_tick is not None and on_tick():
                return
            if not self.streaming:
                continue
            if self._sampler is None:
                self._sampler = self._new_sampler()
            flushes += 1
            self.flush(sample=flushes % RESOURCES_EVERY == 0, last=everything)

    def flush(self, sample: bool = False, last: bool = False) -> None:
        """Write what has accumulated; ``last``: nothing is held back (the run ends, or an
        epoch ran out)."""
        with self._lock:
            # A slice now and a delete once written, each atomic under the GIL while the
            # measuring thread appends: a failed write is retried at the next flush.
            events, taken = self.events[:], self.taken[:]
            rows: list = []
            windows: list[BatchWindow] = []
            try:
                if self.windowed is not None:  # (only the rows it keeps are built)
                    rows, windows = self.windowed.through(taken, last, self)
                else:
                    rows = rows_of_taken(self.t0, taken)
            except Exception:  # noqa: BLE001 - a bug of ours: never the job's, nor a stop to
                self.report_failure()  # the recording (those batches are dropped, once said)
                del self.taken[:len(taken)]
                taken = []
                if self.windowed is not None:
                    rows, windows = self.windowed.rows[:], self.windowed.windows[:]
            else:
                if self.windowed is not None:  # (held by it now, or written below)
                    del self.taken[:len(taken)]
            columns = self.columns.peek() if self.columns is not None else None
            written_seq = (rows[-1][0] if rows else columns.first_seq + len(columns) - 1
                           if columns else self._written_seq)
            if windows:
                written_seq = max(written_seq, windows[-1].last_seq)
            late = protocol.LateTimings(
                [g for g in self.gaps[:] if g[0] <= written_seq],
                [c for c in self.copies[:] if c[0] <= written_seq])
            batch = events + ([protocol.Windows([w.to_row() for w in windows])] if windows
                              else [])
            batch += [protocol.Batches(rows)] if rows else []
            batch += [protocol.Batches.of_columns(columns)] if columns else []
            batch += [late] if late.gaps or late.copies else []
            if sample:
                try:
                    self.last_resources = self._resources()
                    batch.append(self.last_resources)
                except Exception:  # noqa: BLE001 - a sampling hiccup: this sample is skipped
                    pass
            try:
                if batch:
                    self.sink.write(batch)
            except Exception:  # noqa: BLE001 - never the measured job's problem
                self.report_failure()
                backlogs = ([self.windowed.rows, self.windowed.windows]
                            if self.windowed is not None else [])
                for backlog in (self.taken, self.gaps, self.copies, *backlogs):
                    if len(backlog) > MAX_BACKLOG:  # a sink that stays down
                        del backlog[:len(backlog) - MAX_BACKLOG]
                if self.columns is not None and len(self.columns) > MAX_BACKLOG:
                    self.columns.drop(len(self.columns) - MAX_BACKLOG)
                return
            del self.events[:len(events)]
            if self.windowed is not None:
                self.windowed.written(len(rows), len(windows))
            else:
                del self.taken[:len(taken)]
            if columns and self.columns is not None:
                self.columns.drop(len(columns))
            for done, pending in ((late.gaps, self.gaps), (late.copies, self.copies)):
                for item in done:
                    pending.remove(item)
            self._written_seq = written_seq
            if self.recent is not None and self.windowed is None:
                self.recent.extend(taken)

    def pending(self) -> int:
        """Batches measured and not yet written."""
        held = self.windowed.pending() if self.windowed is not None else 0
        return len(self.taken) + held + (len(self.columns) if self.columns is not None else 0)

    def _new_sampler(self) -> ResourceSampler:
        share = (ResourceSampler.USS_MAX_CPU_SHARE if self.in_job
                 else ResourceSampler.ENGINE_USS_CPU_SHARE)
        return ResourceSampler(self.worker_ids, share)  # (primes the CPU counters)

    def _resources(self) -> protocol.Resources:
        if self._sampler is None:
            self._sampler = self._new_sampler()
        sample = self._sampler.sample(time.monotonic() - self.t0)
        if not self.in_job:
            return sample
        mine = [p for p in sample.procs if p["role"] == "main" or p["pid"] in self.worker_ids]
        return replace(sample, procs=mine)

    def report_failure(self) -> None:
        if not self._failed:
            self._failed = True
            sys.stderr.write(f"[dataloader-tuner] could not write the measurements to "
                             f"{self.sink.where}; measuring goes on unrecorded:\n"
                             + traceback.format_exc())

    def sleep_unless_stopped(self, seconds: float) -> None:
        """On the thread: sleep ``seconds``, cut short by stop() (a run that ends while its
        Ready still watches the machine's load does not wait for that)."""
        self._wakes.stop.wait(seconds)

    def stop(self, sample: bool = True) -> None:
        """End the thread and write what is left (idempotent)."""
        if self._wakes.stop.is_set():
            return
        self._wakes.stop.set()
        self._wakes.soon.set()  # the thread wakes to see it
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(5.0)
        self.flush(sample=sample, last=True)


class WindowedRows:
    """A watched loader's batches on their way to its history through a Thinner (NOTE [ Windows
    for fast loaders ]), as taken (their rows built only where kept): the rows and windows it
    let out that no write has taken yet."""

    def __init__(self, loose_below: int, t0: float) -> None:
        self.thinner = Thinner(loose_below, TakenForm(t0))
        self.rows: list = []
        self.windows: list[BatchWindow] = []

    def through(self, measured: list[TakenBatch], last: bool, recorder: Recorder
                ) -> tuple[list, list[BatchWindow]]:
        """The recorder's batches taken (``measured``, as many) into the thinner (its now),
        once its late GPU timings went onto the batches the thinner holds, these among them;
        what waits to be written."""
        thinner = self.thinner
        kept: list
        kept, windows = thinner.arrived(measured, hold=True)  # (slow ones: straight out)
        for gap in recorder.gaps[:]:
            if thinner.late(gap[0], gpu_gap_ms=gap[1]):
                recorder.gaps.remove(gap)
        for copy in recorder.copies[:]:
            if thinner.late(copy[0], h2d_ms=copy[1], h2d_other_ms=copy[2]):
                recorder.copies.remove(copy)
        if thinner.tail:  # (then nothing went straight out)
            kept, windows = thinner.take(time.monotonic() - recorder.t0)
        if recorder.recent is not None:  # every batch: a rank's report reads its recent ones
            recorder.recent.extend(measured)
        self.rows += kept
        self.windows += windows
        if last:
            held_rows, held_windows = thinner.flush()
            self.rows += held_rows
            self.windows += held_windows
        return self.rows[:], self.windows[:]

    def written(self, rows: int, windows: int) -> None:
        del self.rows[:rows]
        del self.windows[:windows]

    def pending(self) -> int:
        """Rows and windows held: in the thinner's tail, or let out and not yet written."""
        return len(self.thinner.tail) + len(self.rows) + len(self.windows)
