"""LiveRun: everything received from a run so far, folded from its events.

Only the runner's reader thread writes to it (append-only lists), so readers can take
snapshots without locks. The finished result is a results.ProfileResult or TuneResult, built
by ``report``; the live object and the result are different things.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from dataloader_tuner import protocol
from dataloader_tuner.errors import EngineError
from dataloader_tuner.record.cards import Consumer, DatasetCard
from dataloader_tuner.record.rows import BatchRecord, row_index
from dataloader_tuner.record.trials import TrialRecord, TunePlan
from dataloader_tuner.record.windows import BatchWindow, latest_stretch
from dataloader_tuner.run.output import OutputLog
from dataloader_tuner.system import SystemSnapshot
from dataloader_tuner.analyse import run_results
from dataloader_tuner.analyse.hotspots import SampledProfile
from dataloader_tuner.analyse.results import ProfileResult, Result, TuneResult

if TYPE_CHECKING:
    from dataloader_tuner.store import RunStore


class LiveRun:
    def __init__(self, target: str, tuned_workers: int | None = None,
                 mode: str = "profile") -> None:
        """``mode``: the run's kind as asked (a tune that fails before its child's Ready is
        still summarised as a tune); Ready confirms it."""
        self.target = target
        self.tuned_workers = tuned_workers  # a count the tuner measured to pay (pitfalls.py)
        # What the run said of itself before its first batch: the dataset card, the settings,
        # the consumer, the machine, how samples are counted (properties below read it)
        self.ready: protocol.Ready | None = None
        self.warmup_batches = 1  # (a window of the last batches starts its own: recent())
        self.batches: list[BatchRecord] = []  # each batch's row, or a sample where windows
        self.windows: list[BatchWindow] = []  # fast batches (NOTE [ Windows for fast loaders ])
        self.resources: list[dict] = []  # flat rows: t, pid, role, worker_id, cpu_percent, rss_mb
        self.gpu_samples: list[dict] = []
        self.epochs: list[dict] = []
        self.error: EngineError | None = None
        self.finished_reason: str | None = None
        self.elapsed_s = 0.0
        self.mode = mode
        self.trials: list[TrialRecord] = []  # each measured setting (tunes, in-place searches)
        self.tune_document: dict | None = None
        self.plan: TunePlan | None = None  # a tune's latest plan (tune/plan.py)
        self.probes: list[dict] = []  # per worker process: what its first fetch revealed
        self.overdue: list[protocol.Overdue] = []  # batches reported late (instrument/stalls.py)
        self.labels: protocol.Labels | None = None  # the class counts, sent at the end
        self.stacks = SampledProfile()  # every process's sampled stacks (sampler.py)
        self.output = OutputLog()  # what the user's code printed (fed by the runner)

    def apply(self, event: protocol.Event) -> None:
        if isinstance(event, protocol.Batches):  # the common one first
            self.batches.extend(BatchRecord.from_row(row) for row in event.rows)
            if self.batches:
                last = self.batches[-1]
                self.elapsed_s = max(self.elapsed_s, last.t_ready + last.step_s)
        elif isinstance(event, protocol.Windows):
            self.windows.extend(event.folded())
            if self.windows:
                self.elapsed_s = max(self.elapsed_s, self.windows[-1].t_end)
        elif isinstance(event, protocol.LateTimings):
            self._set_late_timings(event)
        elif isinstance(event, protocol.Resources):
            self.elapsed_s = max(self.elapsed_s, event.t)
            for proc in event.procs:
                self.resources.append({"t": event.t, **proc})
            if event.gpu:
                self.gpu_samples.append({"t": event.t, **event.gpu})
        elif isinstance(event, protocol.Ready):
            self.ready, self.mode = event, event.mode
            self.warmup_batches = event.warmup_batches
        elif isinstance(event, protocol.Plan):
            self.plan = event.plan
        elif isinstance(event, protocol.Measured):
            self.trials.append(event.trial)
        elif isinstance(event, protocol.Tuned):
            self.tune_document = event.result
        elif isinstance(event, protocol.Epoch):
            self.epochs.append({"epoch": event.epoch, "t": event.t, "startup_s": event.startup_s})
        elif isinstance(event, protocol.WarningCaught):  # its workers' go to the log
            self.output.add(event.code, event.message, event.where)
        elif isinstance(event, protocol.Probe):
            self.probes.append({"pid": event.pid, "worker_id": event.worker_id,
                                "probe": event.probe})
        elif isinstance(event, protocol.Profiled):
            self.stacks.add(event.pid, event.sampled)
        elif isinstance(event, protocol.Overdue):
            self.overdue.append(event)
        elif isinstance(event, protocol.Labels):
            self.labels = event
        elif isinstance(event, protocol.Error):
            self.error = EngineError.from_dict(event.error)
        elif isinstance(event, protocol.Finished):
            self.finished_reason = event.reason
            self.elapsed_s = max(self.elapsed_s, event.t)

    @property
    def dataset(self) -> DatasetCard | None:
        return self.ready.dataset if self.ready else None

    @property
    def config(self) -> dict[str, Any] | None:
        return self.ready.config if self.ready else None

    @property
    def snippet(self) -> str | None:
        return self.ready.snippet if self.ready else None

    @property
    def consumer(self) -> Consumer | None:
        return self.ready.consumer if self.ready else None

    @property
    def system(self) -> SystemSnapshot | None:
        return self.ready.system if self.ready else None

    @property
    def torch_version(self) -> str | None:
        return self.ready.torch if self.ready else None

    @property
    def counting(self) -> dict[str, Any] | None:
        """How samples and bytes are counted (child/process.py)."""
        return self.ready.counting if self.ready else None

    @property
    def label_counts(self) -> dict[Any, int]:
        return self.labels.counts if self.labels else {}

    @property
    def label_source(self) -> str:
        """"batches", or "dataset": its own targets/labels list, all of it."""
        return self.labels.source if self.labels else "batches"

    @property
    def ranks_on_node(self) -> int:
        """Loaders sharing this machine's /dev/shm (a torchrun job's)."""
        return self.ready.ranks_on_node if self.ready else 1

    def _set_late_timings(self, event: protocol.LateTimings) -> None:
        """Onto their batches, found by number (rows arrive in order; where fast batches are
        kept in windows, not every batch has one)."""
        updates: dict[int, dict] = {}
        for seq, gap_ms in event.gaps:
            updates.setdefault(seq, {})["gpu_gap_ms"] = gap_ms
        for seq, ms, other_ms in event.copies:
            updates.setdefault(seq, {}).update(h2d_ms=ms, h2d_other_ms=other_ms)
        for seq, fields in updates.items():
            index = row_index(self.batches, seq)
            if index is not None:
                self.batches[index] = self.batches[index]._replace(**fields)

    @classmethod
    def stored(cls, store: "RunStore", run_id: int, last_batches: int | None = None,
               stacks: bool = True) -> "LiveRun":
        """A run as far as the history has it, folded as if its events had just arrived: how
        the dashboard follows a run another process writes (a watched training job). With
        ``last_batches``, only the most recent ones (their window starts the steady state);
        without ``stacks``, not its sampled stacks (an ended run's result has them merged)."""
        run = store.get_run(run_id)
        live = cls(run.target if run is not None else "")
        for event in store.events(run_id, but=None if stacks else protocol.Profiled.kind):
            live.apply(event)
        live.resources = store.resources(run_id)
        live.read_rows(store, run_id, last_batches)
        return live

    def read_rows(self, store: "RunStore", run_id: int, last_batches: int | None) -> None:
        """Its batch rows and windows as the history has them now (the ``last_batches`` most
        recent, if given), in place of those it held."""
        batches = store.batches(run_id, last_batches)
        windows = store.windows(run_id, batches[0].seq if batches else 0)
        if last_batches is not None and batches and batches[0].seq > 0:
            self.warmup_batches = 1
            batches, windows = latest_stretch(batches, windows)
        self.batches, self.windows = batches, windows
        if batches:
            self.elapsed_s = max(self.elapsed_s, batches[-1].t_ready + batches[-1].step_s)
        if windows:
            self.elapsed_s = max(self.elapsed_s, windows[-1].t_end)
        if self.resources:
            self.elapsed_s = max(self.elapsed_s, self.resources[-1]["t"])

    def batches_seen(self) -> int:
        """Batches the run has made so far (its rows may be a sample: record/windows.py)."""
        last_row = self.batches[-1].seq if self.batches else -1
        return max(last_row, self.windows[-1].last_seq if self.windows else -1) + 1

    def worker_pids(self) -> set[int]:
        pids = {r["pid"] for r in self.resources if r["role"] == "worker"}
        return pids | {b.worker_pid for b in self.batches if b.worker_id >= 0}

    def recent(self, max_batches: int) -> "LiveRun":
        """A view of the last ``max_batches`` batches (and the resource samples since), for a
        live display that must stay cheap on runs with 100k+ batches. The window's first batch
        starts its steady-state clock."""
        if len(self.batches) <= max_batches:
            return self
        view = copy.copy(self)
        view.batches, view.windows = latest_stretch(self.batches[-max_batches:], self.windows)
        view.warmup_batches = 1
        since = view.batches[0].t_request
        view.resources = [r for r in self.resources if r["t"] >= since]
        return view

    def profile_result(self, status: str) -> ProfileResult:
        """The figures of a run that measured one setting (profile, verify, a watched loader)."""
        return run_results.profile_result(self, status)

    def tune_result(self, status: str) -> TuneResult:
        """A tune's trials and recommendation."""
        return run_results.tune_result(self, status)

    def result(self, status: str) -> "Result":
        """Either, by the run's kind: for what shows any run (the history, the pages)."""
        return self.tune_result(status) if self.mode == "tune" else self.profile_result(status)


class Followed:
    """A run another process is writing (a watched job), followed across a page's refreshes:
    each reads the events and resource samples written since the last, where
    ``LiveRun.stored`` reads them all (a job's sampled stacks alone add a few events a
    second); its latest batch rows are read again each time, as they are few."""

    def __init__(self, store: "RunStore", run_id: int, last_batches: int | None) -> None:
        self.store, self.run_id, self.last_batches = store, run_id, last_batches
        run = store.get_run(run_id)
        self.live = LiveRun(run.target if run is not None else "")
        self.after = 0  # the number of the last event read

    def refresh(self) -> LiveRun:
        live = self.live
        live.batches, live.windows = [], []  # events are applied before the rows, as stored()
        events, self.after = self.store.events_after(self.run_id, self.after)
        for event in events:
            live.apply(event)
        live.resources += self.store.resources(
            self.run_id, live.resources[-1]["t"] if live.resources else float("-inf"))
        live.read_rows(self.store, self.run_id, self.last_batches)
        return live
