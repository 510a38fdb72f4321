"""Where a recorder's events go (run/recorder.py): the engine child's pipe to its parent, or
the run history a watched training job writes. A sink writes a flush's events in order or
raises; what to do then (report once, keep them for the next flush, cap the backlog) is the
recorder's one policy."""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import replace
from typing import Protocol, Sequence

from dataloader_tuner import protocol
from dataloader_tuner.analyse.hotspots import SampledProfile
from dataloader_tuner.errors import EngineError
from dataloader_tuner.analyse.results import ProfileResult
from dataloader_tuner.run.live import LiveRun
from dataloader_tuner.store import RunStore, retention

# A watched run's final result covers at most this many recent batches (a week-long job makes
# millions); every batch is still written to the history.
KEPT_BATCHES = 100_000


class Sink(Protocol):
    where: str  # named when a write fails

    def write(self, events: Sequence[protocol.Event]) -> None:
        """All of ``events``, in order, or raise (the recorder keeps them for the next flush)."""


class PipeSink:
    """JSON lines to the engine's parent on an inherited pipe; thread-safe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.where = f"the event pipe (fd {fd})"
        self.lock = threading.Lock()
        self.broken = False

    def write(self, events: Sequence[protocol.Event]) -> None:
        data = b"".join(protocol.encode(event) for event in events)
        with self.lock:
            if self.broken:  # the parent is gone: the child's watchdog stops the run
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view):]
            except OSError:
                self.broken = True

    def send(self, event: protocol.Event) -> None:
        """One event now, from any thread (a warning, an error, the run's end); never raises."""
        self.write([event])


class HistorySink:
    """A watched loader's run in the history (SQLite), written as the engine's own runs are (the
    same events, the same tables), with a heartbeat each flush: a job killed outright leaves its
    run readable up to the last flush, and marked "lost" once its process is gone."""

    def __init__(self, store: RunStore, run_id: int, keep_stacks: bool = False) -> None:
        """``keep_stacks``: also merge the sampled stacks as they pass, for ``sampled()`` (a
        torchrun rank's report says where its loader's time goes)."""
        self.store, self.run_id = store, run_id
        self.where = store.path
        self.tune_requested = False  # the dashboard's "Tune this job", seen at a flush
        self.within_limits = False  # the history's limits kept, at the first flush
        self.stacks = SampledProfile() if keep_stacks else None
        self._stacks_lock = threading.Lock()  # written by the recorder's thread, read by another

    def write(self, events: Sequence[protocol.Event]) -> None:
        self.store.record_events(self.run_id, events, heartbeat=True)  # all or nothing
        if not self.within_limits:  # on this writer thread, never the job's (retention.py)
            self.within_limits = True
            retention.keep_within_or_say(self.where)
        if self.stacks is not None:
            with self._stacks_lock:
                for event in events:
                    if isinstance(event, protocol.Profiled):
                        self.stacks.add(event.pid, event.sampled)
        if not self.tune_requested:
            try:
                self.tune_requested = self.store.tune_requested(self.run_id)
            except sqlite3.Error:  # asked again at the next flush; the flush itself is written
                pass

    def sampled(self) -> dict | None:
        """Where the loader's time went so far (hotspots.py's merged stacks), where kept."""
        if self.stacks is None:
            return None
        with self._stacks_lock:
            return self.stacks.merged()

    def finish(self, status: str, elapsed_s: float, error: dict | None) -> ProfileResult:
        """End the run and return its result, summarised from what was written (not kept in
        memory while training: the training thread never pays for that bookkeeping)."""
        return finish_stored(self.store, self.run_id, status, elapsed_s, error)


def finish_stored(store: RunStore, run_id: int, status: str, elapsed_s: float,
                  error: dict | None, ended_at: float | None = None) -> ProfileResult:
    """End a run its writer measured: its result summarised from what the history has of it
    (``ended_at``: when it ended, None: now)."""
    store.record_event(run_id, protocol.Finished("error" if status == "error" else "done",
                                                 elapsed_s))
    live = LiveRun.stored(store, run_id, KEPT_BATCHES)
    result = replace(live.profile_result(status), run_id=run_id,
                     error=EngineError.from_dict(error) if error else None)
    store.finish_run(run_id, status, result, error, ended_at)
    return result
