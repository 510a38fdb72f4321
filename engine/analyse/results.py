"""The finished result of a run, typed: what ``--json`` prints, the store keeps and the history
page shows.

A profile (or verification) run ends as a ``ProfileResult``, a tune as a ``TuneResult``; both
are built once, from the run's events (run_results.py), and never changed after. ``to_dict``
writes the JSON document the CLI has always printed (the contract programs read);
``from_dict`` reads one back, also one saved by an older version (missing figures become None,
a diagnostic code no longer in the catalogue is kept as it was saved).

What crosses from one part to another is typed with the class that part uses (the dataset
card, the consumer, the error, the system, the diagnostics, a tune's trials); the figures
inside (per-worker rows, latency percentiles, the input wait's figures) stay plain JSON
objects: data to show, written once and read by no code but the pages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, Union

from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.errors import EngineError
from dataloader_tuner.record.cards import Consumer, DatasetCard
from dataloader_tuner.record.trials import TrialRecord, duration, spoken_range, trial_from_dict
from dataloader_tuner.system import SystemSnapshot


def _diagnostics(docs: list[dict[str, Any]] | None) -> tuple[Diagnostic, ...]:
    return tuple(Diagnostic.from_dict(d, strict=False) for d in docs or [])


_R = TypeVar("_R", bound="_Result")


@dataclass(frozen=True)
class _Result:
    """What every result has: how the run ended and what it ran on."""

    status: str  # "ok" | "stopped" | "error"
    target: str
    dataset: DatasetCard | None = None
    system: SystemSnapshot | None = None
    consumer: Consumer | None = None
    torch: str | None = None
    warnings: tuple[Diagnostic, ...] = ()
    error: EngineError | None = None
    run_id: int | None = None  # where the store keeps it, once saved

    # Written only when set, as the documents always were.
    OPTIONAL: ClassVar[tuple[str, ...]] = ("error", "run_id")

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self.OPTIONAL and value is None:
                continue
            if isinstance(value, tuple):
                value = [v.to_dict() if hasattr(v, "to_dict") else v for v in value]
            elif hasattr(value, "to_dict"):  # (each typed field's class writes its own)
                value = value.to_dict()
            doc[f.name] = value
        return doc

    @classmethod
    def from_dict(cls: type[_R], doc: dict[str, Any]) -> _R:
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {k: v for k, v in doc.items() if k in names}
        values["warnings"] = _diagnostics(doc.get("warnings"))
        for name, read in TYPED_FIELDS.items():
            if isinstance(doc.get(name), dict):
                values[name] = read(doc[name])
        values.setdefault("target", "")
        return cls(**values)

    @property
    def failed(self) -> bool:
        return self.status == "error"

    @property
    def error_message(self) -> str:
        return self.error.message if self.error is not None else ""


# How each typed field of a result reads its JSON (an older document's included).
TYPED_FIELDS: dict[str, Any] = {"dataset": DatasetCard.from_dict,
                                "system": SystemSnapshot.from_dict,
                                "consumer": Consumer.from_dict, "error": EngineError.from_dict}


@dataclass(frozen=True)
class ProfileResult(_Result):
    """A profile or verification run: the steady-state figures of the loader as it was set."""

    kind: ClassVar[str] = "profile"
    config: dict[str, Any] | None = None  # LoaderConfig.to_json_dict()
    snippet: str | None = None  # the DataLoader(...) line of these settings
    seconds: float = 0.0
    epochs: int = 0
    batches: int = 0
    warmup_batches: int = 0
    steady_batches: int = 0
    samples_per_s: float | None = None  # steady state; None when there was none
    batches_per_s: float | None = None
    batch_latency_ms: dict[str, Any] | None = None  # p50/p95/max/mean of next() waits
    startup_s: float | None = None
    per_batch: dict[str, Any] | None = None
    counting: dict[str, Any] | None = None  # how samples and bytes were counted
    workers: tuple[dict[str, Any], ...] = ()  # one dict per DataLoader worker id
    main_process: dict[str, Any] | None = None
    consumer_idle_frac: float | None = None  # steady state: after warm-up, to the end
    # The whole run as the loop lived it, epoch start-ups included (metrics.InputWait.to_dict)
    input_wait: dict[str, Any] | None = None
    input_bound: str | None = None
    transfer: dict[str, Any] | None = None
    gpu_idle: dict[str, Any] | None = None
    not_measured: str | None = None  # why the GPU figures are missing
    # Where the loader's time goes (analyse/hotspots.py): the stages' shares and the functions
    # ranked, where enough was sampled; what was sampled in any case.
    stages: tuple[dict[str, Any], ...] = ()
    hotspots: tuple[dict[str, Any], ...] = ()
    flame: tuple[dict[str, Any], ...] = ()  # each stage's time by function: the icicle's
    stacks_sampled: dict[str, Any] | None = None
    # the stacks themselves (hotspots.py's "collapsed"), for an export (speedscope.py)
    stacks_collapsed: dict[str, Any] | None = None
    # how far this machine can go for the dataset, what would raise it, and the fixes named
    # (analyse/ceiling.py, fixes.py): with workers only, from this run's own figures
    ceiling: dict[str, Any] | None = None
    what_if: tuple[dict[str, Any], ...] = ()
    fixes: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return _ordered(super().to_dict(), PROFILE_KEYS)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "ProfileResult":
        result = super().from_dict(doc)
        return dataclasses.replace(result, workers=tuple(doc.get("workers") or ()),
                                   stages=tuple(doc.get("stages") or ()),
                                   hotspots=tuple(doc.get("hotspots") or ()),
                                   flame=tuple(doc.get("flame") or ()),
                                   what_if=tuple(doc.get("what_if") or ()),
                                   fixes=tuple(doc.get("fixes") or ()))

    @property
    def headline_samples_per_s(self) -> float | None:
        return self.samples_per_s


@dataclass(frozen=True)
class TuneResult(_Result):
    """A tune: the recommendation, what it was compared with, and every trial behind it."""

    kind: ClassVar[str] = "tune"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("error", "run_id", "settings_file")
    recommended: dict[str, Any] | None = None  # DataLoader keyword arguments
    snippet: str | None = None
    expected_samples_per_s: float | None = None
    expected_consumer_idle_frac: float | None = None
    uncertainty_pct: float | None = None
    baseline: dict[str, Any] | None = None  # the starting settings' rate and the claimed speedup
    trials: tuple[TrialRecord, ...] = ()
    reasons: tuple[str, ...] = ()
    profile: dict[str, Any] | None = None  # the cost profile the search started from
    limits: dict[str, Any] | None = None
    tuning_seconds: float | None = None
    trial_seconds: float | None = None
    # the last plan (tune/plan.py's TunePlan fields); "announced_s" and "announced_at_most_s"
    # the first one's estimate and its at most
    plan: dict[str, Any] | None = None
    # where the trials' time went inside their processes (analyse/hotspots.py's merged stacks:
    # looks, seconds, processes, enough, stages, hotspots, flame), where sampled
    stacks: dict[str, Any] | None = None
    # the most this machine can make for this dataset, and what would raise it
    # (analyse/ceiling.py's Ceiling.to_dict and what_if), where the cost model was learnt
    ceiling: dict[str, Any] | None = None
    what_if: tuple[dict[str, Any], ...] = ()
    fixes: tuple[dict[str, Any], ...] = ()  # named where a stage is recognised (fixes.py)
    settings_file: str | None = None  # where `tune --out` wrote the settings

    def to_dict(self) -> dict[str, Any]:
        return _ordered(super().to_dict(), TUNE_KEYS)

    def announced(self) -> str | None:
        """What the tune said it would take as it started, and again after its first trials
        where that differed: "~8 s, at most ~46 s; ~47 s after the first trials"."""
        plan = self.plan or {}
        expected, most = plan.get("announced_s"), plan.get("announced_at_most_s")
        if not expected:
            return None
        said, said_most = spoken_range(expected, most)
        text = f"~{said}" + (f", at most ~{said_most}" if said_most else "")
        later = duration(plan["estimated_s"]) if plan.get("estimated_s") else said
        if later != said:
            text += f"; ~{later} after the first trials"
        return text

    def against_floor(self) -> str | None:
        """How close the tune came to the least any tune of this dataset takes here (NOTE [
        The floor ], tune/plan.py): "1.6x the ~25 s floor"."""
        floor = (self.plan or {}).get("floor_s")
        if not floor or not self.tuning_seconds:
            return None
        return f"{self.tuning_seconds / floor:.1f}x the ~{duration(floor)} floor"

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "TuneResult":
        result = super().from_dict(doc)
        return dataclasses.replace(result, trials=tuple(trial_from_dict(t)
                                                        for t in doc.get("trials") or ()),
                                   reasons=tuple(doc.get("reasons") or ()),
                                   what_if=tuple(doc.get("what_if") or ()),
                                   fixes=tuple(doc.get("fixes") or ()))

    @property
    def headline_samples_per_s(self) -> float | None:
        return self.expected_samples_per_s


Result = Union[ProfileResult, TuneResult]

# The documents' key order as the CLI has always printed them (readers do not depend on it;
# people reading --json do).
PROFILE_KEYS = (
    "status", "target", "dataset", "config", "snippet", "torch", "consumer", "seconds", "epochs",
    "batches", "warmup_batches", "steady_batches", "samples_per_s", "batches_per_s",
    "batch_latency_ms", "startup_s", "per_batch", "counting", "workers", "main_process",
    "consumer_idle_frac", "input_wait", "input_bound", "transfer", "gpu_idle", "not_measured",
    "stages", "hotspots", "flame", "stacks_sampled", "stacks_collapsed", "ceiling", "what_if",
    "fixes", "system", "warnings", "error", "run_id")
TUNE_KEYS = (
    "status", "target", "dataset", "system", "consumer", "torch", "recommended", "snippet",
    "expected_samples_per_s", "expected_consumer_idle_frac", "uncertainty_pct", "baseline",
    "trials", "reasons", "warnings", "profile", "limits", "tuning_seconds", "trial_seconds",
    "plan", "stacks", "ceiling", "what_if", "fixes", "error", "run_id", "settings_file")


def _ordered(doc: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: doc[k] for k in keys if k in doc}


def result_from_dict(kind: str, doc: dict[str, Any]) -> Result:
    """A saved document as its type: tunes by their kind, every other run as a profile."""
    return TuneResult.from_dict(doc) if kind == "tune" else ProfileResult.from_dict(doc)
