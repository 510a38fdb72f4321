"""The engine's process protocol as types: the request a run starts from and every event it
emits. Whoever produces a run (the engine's child process today, an in-process watcher next)
emits these; whoever consumes one (LiveRun, the run store, the CLI's progress lines) reads them,
dispatching on the type, never on a string.

NOTE [ Engine process protocol ]

    parent (CLI / dashboard)                    child: python -m dataloader_tuner.child
    ------------------------                    -----------------------------------------
    Popen(start_new_session=True) ------------> reads RunRequest.to_json() from stdin
                                                resolves the target  --(error)--> exit 1
    <------------ event pipe: JSON lines ------ Ready    dataset, config, system, counting
    <------------------------------------------ Epoch    each epoch's start (profile runs)
    <------------------------------------------ Probe    a worker's first fetch, once each
    <------------------------------------------ Profiled  a process's sampled stacks (sampler.py)
    <------------------------------------------ Batches  packed rows (wire.py) every 0.25 s
    <------------------------------------------ LateTimings  GPU times resolved after their rows
    Windows  fast batches' rows, folded here (record/windows.py)
    EpochEnded  a watched epoch ran out, written at once (run/settle.py)
    <------------------------------------------ Resources  CPU/memory per process every 0.5 s
    <------------------------------------------ WarningCaught  a warning the child caught
    <------------------------------------------ Overdue  a batch late, who holds it (stalls.py)
    <------------------------------------------ Plan     what a tune will take (tune runs)
    <------------------------------------------ Measured  one setting measured (tune, in place)
    <------------------------------------------ Tuned    the recommendation (tune runs)
    <------------------------------------------ Labels   class counts, at the end
    <------------------------------------------ Error    what failed, typed (errors.py)
    SIGTERM (stop) ---------------------------> handler raises StopRun in the main thread
                                                kills + reaps its DataLoader workers
    <------------------------------------------ Finished reason; exit 0 (1 after Error)

On the wire each event is one JSON object whose "e" names its type (``Event.kind``); what the
child's workers print goes to a log file instead (output.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence, Union

from dataloader_tuner.record.cards import Consumer, DatasetCard
from dataloader_tuner.record.columns import BatchColumns, rows_from_wire
from dataloader_tuner.record.trials import TrialRecord, TunePlan, trial_from_dict
from dataloader_tuner.system import SystemSnapshot
from dataloader_tuner.record.wire import pack_rows, unpack_rows
from dataloader_tuner.record.windows import BatchWindow

# Defaults a run starts from, named once: the CLI's flags and the dashboard read them here.
DEFAULT_SECONDS = 15.0
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_BUDGET_S: float | None = None  # a tune runs its plan (NOTE [ A budget in batches ])
DEFAULT_MAX_WORKERS = 32
MAX_OVERDUE = 8  # Overdue reports a run sends at most (NOTE [ When a batch is overdue ])
EVENT_FD_ENV = "DLTUNER_EVENT_FD"  # the inherited pipe the child writes its events to
RUN_KINDS = ("profile", "tune", "verify", "inspect")


@dataclass(frozen=True)
class RunRequest:
    """Everything the child needs; JSON-safe so it crosses the process boundary as text."""

    target: str
    # DataLoader settings the caller chose (JSON-safe); the rest are the module's own (see
    # settings.py). Empty: exactly what the module declares.
    settings: dict[str, Any] = field(default_factory=dict)
    step_ms: float | None = None  # None: the module's train_step if any, else no consumer
    seconds: float = DEFAULT_SECONDS
    timeout_s: float = DEFAULT_TIMEOUT_S
    kind: str = "profile"  # one of RUN_KINDS; "verify" runs as a profile
    label: str | None = None
    budget_s: float | None = DEFAULT_BUDGET_S  # tune only: a hard limit in seconds, or none
    max_workers: int = DEFAULT_MAX_WORKERS  # tune only
    local_world_size: int = 1  # tune only
    # tune only: the job needs batches in the sampler's order, so in_order=False is not tried
    keep_order: bool = False
    # num_workers a tune measured to pay for this target (a settings file, an Apply): the
    # diagnostics do not second-guess it.
    tuned_workers: int | None = None
    # profile runs: sample the stacks of every process doing the loader's work
    # (instrument/sampler.py); False: --no-stacks
    sample_stacks: bool = True
    # Where and for whom the child runs: filled in by to_json() when the request is sent.
    cwd: str | None = None
    parent_pid: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in RUN_KINDS:
            raise ValueError(f"unknown run kind {self.kind!r}: one of {', '.join(RUN_KINDS)}")

    @property
    def measures_loader(self) -> bool:
        """profile and verify runs stream batches; tune runs trials; inspect only loads."""
        return self.kind in ("profile", "verify")

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["cwd"] = self.cwd or os.getcwd()
        doc["parent_pid"] = self.parent_pid or os.getpid()
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "RunRequest":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(doc) - known
        if unknown:  # a parent and child from different versions of the engine
            raise ValueError(f"unknown request fields {sorted(unknown)}")
        return cls(**doc)


# -- events ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready:
    kind: ClassVar[str] = "ready"
    mode: str  # the request's kind as the child runs it: "profile" | "tune" | "inspect"
    pid: int
    dataset: DatasetCard
    config: dict[str, Any]
    snippet: str
    consumer: Consumer
    system: SystemSnapshot
    warmup_batches: int
    counting: dict[str, Any] | None = None
    torch: str | None = None
    ranks_on_node: int = 1  # a torchrun job's LOCAL_WORLD_SIZE: its loaders share /dev/shm

    @classmethod
    def from_wire(cls, doc: dict[str, Any]) -> "Ready":
        fields = {f.name for f in dataclasses.fields(cls)}
        typed = ("system", "dataset", "consumer")
        return cls(**{k: v for k, v in doc.items() if k in fields and k not in typed},
                   system=SystemSnapshot.from_dict(doc["system"]),
                   dataset=DatasetCard.from_dict(doc["dataset"]),
                   consumer=Consumer.from_dict(doc.get("consumer") or {}))


@dataclass(frozen=True)
class Batches:
    """Rows of record.rows.BatchRecord fields, as plain tuples (packed on the wire).

    The engine's child sends its loop's columns as they are (``of_columns``: ``rows`` empty
    there); they arrive as rows, BatchRecords already (NOTE [ Rows built off the loop ],
    record/columns.py)."""

    kind: ClassVar[str] = "batches"
    rows: list[tuple[Any, ...]]
    columns: BatchColumns | None = None

    @classmethod
    def of_columns(cls, columns: BatchColumns) -> "Batches":
        return cls([], columns)

    def to_wire(self) -> dict[str, Any]:
        if self.columns is not None:
            return {"e": self.kind, "columns": self.columns.to_wire()}
        return {"e": self.kind, **pack_rows(self.rows)}

    @classmethod
    def from_wire(cls, doc: dict[str, Any]) -> "Batches":
        if "columns" in doc:
            return cls(list(rows_from_wire(doc["columns"])))
        return cls(unpack_rows(doc))


@dataclass(frozen=True)
class Windows:
    """Batches folded where they came fast (record/windows.py): each a BatchWindow's row. The
    rows kept whole among them travel as Batches. Made in the parent from the child's rows
    (run/runner.py), so the history and every figure read windows."""

    kind: ClassVar[str] = "windows"
    windows: list[Sequence[Any]]

    def folded(self) -> list[BatchWindow]:
        return [BatchWindow.from_row(row) for row in self.windows]


@dataclass(frozen=True)
class LateTimings:
    """GPU timings resolved after their batches were sent (CUDA events are read when done,
    instrument/gpu_events.py): ``gaps`` as ``[seq, idle ms]``, ``copies`` as ``[seq, copy ms,
    other memory kind's copy ms or None]``."""

    kind: ClassVar[str] = "late_timings"
    # Tuples as sent, lists as read back from JSON.
    gaps: list[Sequence[Any]]
    copies: list[Sequence[Any]]


@dataclass(frozen=True)
class Resources:
    """One sample: per process ``{pid, role, worker_id, cpu_percent, rss_mb, threads, uss_mb,
    pss_mb, dirty_mb, helper_cpu_share, busy_threads}`` (instrument.resources.ResourceSampler), and NVML's
    figures on a GPU."""

    kind: ClassVar[str] = "resources"
    t: float
    procs: list[dict[str, Any]]
    gpu: dict[str, Any] | None = None


@dataclass(frozen=True)
class Epoch:
    kind: ClassVar[str] = "epoch"
    epoch: int
    t: float
    startup_s: float


@dataclass(frozen=True)
class EpochEnded:
    """A watched epoch ran out, its last batch taken (NOTE [ Runs ended without a word ],
    run/settle.py): a job whose process is ended right after, without exit handlers, still
    ends finished."""

    kind: ClassVar[str] = "epoch_ended"
    epoch: int
    t: float
    batches: int  # the run's batches taken by then (the next one's seq)


@dataclass(frozen=True)
class Probe:
    """What a worker's first fetch revealed: the random generators it drew from, its thread
    pools (first_fetch.first_fetch_probe)."""

    kind: ClassVar[str] = "probe"
    pid: int
    worker_id: int
    probe: dict[str, Any]


@dataclass(frozen=True)
class Profiled:
    """A process's sampled stacks since its last (instrument/sampler.py): ``sampled`` as
    ``[role, frames, cpu_s, wall_s, looks]``, each frame ``[file, first line, function,
    line]`` (lists once read back from JSON)."""

    kind: ClassVar[str] = "profiled"
    pid: int
    worker_id: int
    sampled: list[Any]


@dataclass(frozen=True)
class Labels:
    kind: ClassVar[str] = "labels"
    # label -> count: int labels, a key that is not an int kept as it came (see _label)
    counts: dict[Any, int]
    source: str = "batches"  # or "dataset": its own targets/labels list, all of it

    @classmethod
    def from_wire(cls, doc: dict[str, Any]) -> "Labels":
        # JSON object keys are strings; the labels were ints (measure.py counts int labels only).
        return cls({_label(k): v for k, v in doc["counts"].items()}, doc.get("source", "batches"))


@dataclass(frozen=True)
class WarningCaught:
    kind: ClassVar[str] = "warning"
    code: str
    message: str
    where: str = ""


@dataclass(frozen=True)
class Overdue:
    """The loop has waited far longer than usual for batch ``seq`` (instrument/stalls.py)."""

    kind: ClassVar[str] = "overdue"
    seq: int
    t: float  # when the loop asked for it (since the run's start)
    waited_s: float  # how long it had waited when reported
    usual_s: float | None  # the loop's usual time per batch then (None: none measured yet)
    opening: bool  # the first batch of an epoch, its workers' start-up included
    # who holds it, oldest first: {worker_id, indices, stack} (stalls.where_stuck)
    outstanding: list[dict[str, Any]]


@dataclass(frozen=True)
class Plan:
    """What a tune will measure and how long it takes (tune/plan.py), as soon as the first batch
    tells, and again once the probes have taught the cost model."""

    kind: ClassVar[str] = "plan"
    plan: TunePlan

    @classmethod
    def from_wire(cls, doc: dict[str, Any]) -> "Plan":
        return cls(TunePlan.from_dict(doc["plan"]))


@dataclass(frozen=True)
class Measured:
    """One setting measured: an offline tune's trial, or a line of a watched job's in-place
    search (its decision)."""

    kind: ClassVar[str] = "trial"
    trial: TrialRecord

    @classmethod
    def from_wire(cls, doc: dict[str, Any]) -> "Measured":
        return cls(trial_from_dict(doc["trial"]))


@dataclass(frozen=True)
class Tuned:
    """The tuner's recommendation (child/tuning.py's tune_document); the parent completes it into a
    results.TuneResult."""

    kind: ClassVar[str] = "tune_result"
    result: dict[str, Any]


@dataclass(frozen=True)
class Error:
    kind: ClassVar[str] = "error"
    error: dict[str, Any]  # errors.EngineError.to_dict(), with its class's name


@dataclass(frozen=True)
class Finished:
    kind: ClassVar[str] = "finished"
    reason: str  # "deadline" | "stopped" | "error" | "done"
    t: float


def _label(key: str) -> int | str:
    try:
        return int(key)
    except ValueError:  # not an int label after all: keep it as it came, never fail a run
        return key


Event = Union[Ready, Batches, Windows, LateTimings, Resources, Epoch, EpochEnded, Probe, Profiled,
              Labels, WarningCaught, Overdue, Plan, Measured, Tuned, Error, Finished]
EVENT_TYPES: dict[str, type[Event]] = {cls.kind: cls for cls in (
    Ready, Batches, Windows, LateTimings, Resources, Epoch, EpochEnded, Probe, Profiled, Labels,
    WarningCaught, Overdue, Plan, Measured, Tuned, Error, Finished)}


def to_wire(event: Event) -> dict[str, Any]:
    """The JSON object for ``event``: its fields (a typed one, such as the system snapshot, as
    its ``to_dict()``) and its kind under "e"."""
    custom: Callable[[], dict[str, Any]] | None = getattr(event, "to_wire", None)
    if custom is not None:
        return custom()
    values = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    return {"e": event.kind, **{name: value.to_dict() if hasattr(value, "to_dict") else value
                                for name, value in values.items()}}


def from_wire(doc: dict[str, Any]) -> Event:
    """The event a JSON object stands for; ValueError for a kind this engine does not know."""
    cls = EVENT_TYPES.get(doc.get("e", ""))  # no "e": "", which is no kind
    if cls is None:
        raise ValueError(f"unknown event kind {doc.get('e')!r}")
    if "from_wire" in cls.__dict__:  # the types JSON does not carry as they are
        # Looked up by name: only some event types have one (not an attribute of Event).
        read: Callable[[dict[str, Any]], Event] = getattr(cls, "from_wire")
        return read(doc)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in doc.items() if k in names})


def encode(event: Event) -> bytes:
    """One line for the event pipe."""
    doc = to_wire(event)
    if isinstance(event, Batches):
        # base64 needs no escaping: its strings go in as they are, sparing json its scan of
        # each (~2k instructions a batch of the child's ~530k on long_tail: bench/instructions.py)
        if event.columns is None:
            return f'{{"e": "{event.kind}", "n": {doc["n"]}, "rows": "{doc["rows"]}"}}\n'.encode()
        columns = doc["columns"]
        rest = json.dumps({k: v for k, v in columns.items() if k not in ("clocks", "metas")})
        return (f'{{"e": "{event.kind}", "columns": {{"clocks": "{columns["clocks"]}", '
                f'"metas": "{columns["metas"]}", {rest[1:]}}}\n').encode()
    return (json.dumps(doc, default=str) + "\n").encode()


def decode(line: bytes | str) -> Event:
    return from_wire(json.loads(line))
