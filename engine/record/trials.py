"""The trials a search measures, as they travel (the Measured event) and are kept: an offline
trial of the engine's tune (``TrialResult``, measured by child/trial_run.py) and a decision of
the search inside a watched job (``InPlaceDecision``, from tune/in_place.py)."""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass, fields
from typing import Any, Union


@dataclass(frozen=True)
class TrialResult:
    num_workers: int
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory: bool
    batch_size: int | None
    samples_per_s: float
    batches: int  # steady-state batches behind samples_per_s
    seconds: float  # wall time the trial cost, start-up included
    startup_s: float  # iterator created -> first batch
    consumer_idle_frac: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    worker_ms: float | None  # median fetch + collate per batch inside a worker (or main)
    worker_cpu_ms: float | None  # median CPU of that work
    worker_ms_cv: float | None  # spread of per-batch worker time (burstiness)
    step_ms: float | None  # median consumer step per batch
    main_cpu_ms: float | None  # main-process CPU per batch (receiving batches, the step)
    batch_bytes: float | None
    worker_private_mb: float | None  # per-worker memory not shared with the parent
    h2d_ms: float | None = None  # copy as delivered (pinned when pin_memory)
    h2d_other_ms: float | None = None  # the other memory kind, same batches
    repeat: int = 0
    phase: str = "search"
    # 95% confidence half-width of samples_per_s as a fraction of it (batch means); None when
    # the trial was too short to say. A trial is conclusive when it had MIN_STEADY_BATCHES
    # steady batches and its interval was known: only such trials back a claim.
    rate_ci: float | None = None
    conclusive: bool = True
    batches_per_s: float | None = None  # with batch_size=None a batch holds many samples
    # --local-world-size N: the trial ran N loaders at once (child/companions.py); its own
    # rate is one rank's under that contention, this the N loaders' together.
    ranks_measured: int = 1
    node_samples_per_s: float | None = None
    # Epochs begun inside the steady window: a restarting setting paid its start-up there.
    restarts_measured: int = 0
    in_order: bool = True  # False: batches delivered as workers finish them (torch >= 2.6)
    worker_threads: int | None = None  # 1: each worker's thread pools limited to one thread
    keep_freed_memory: bool = False  # each worker kept the memory it frees (instrument/heap.py)
    # pages its workers faulted in a batch, counted from each one's first (instrument/heap.py)
    worker_faults: float | None = None
    # As read in the trial's workers (NOTE [ Threads per worker ]): each pool's size, the share
    # of their CPU done by threads other than their main one, and their busy threads.
    worker_pools: dict[str, int] | None = None
    helper_cpu_share: float | None = None
    busy_threads: int | None = None
    # the main process's busiest thread's CPU per batch: what one batch at a time costs where
    # threads beside the loop's work too (instrument/resources.py's BusiestThread)
    main_thread_cpu_ms: float | None = None
    # measured in a second, fresh process, not the tune's (NOTE [ A claim from two processes ])
    second_process: bool = False

    @property
    def ms_per_batch(self) -> float:
        """Wall time per batch at this trial's rate."""
        if self.batches_per_s:
            return 1000.0 / self.batches_per_s
        return 1000.0 * (self.batch_size or 1) / self.samples_per_s

    @property
    def key(self) -> tuple[int, int | None, bool, bool]:
        return (self.num_workers, self.prefetch_factor, self.persistent_workers, self.pin_memory)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "TrialResult":
        """Also one an older version wrote (fields added since take their defaults)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})



@dataclass(frozen=True)
class InPlaceDecision:
    """A line of a watched job's search log: the setting tried, what the job's own loop
    measured with it, and the decision (tune/in_place.py)."""

    num_workers: int
    samples_per_s: float | None
    rate_ci: float | None  # 95% half-width of samples_per_s, as a fraction of it
    verdict: str  # plain words: "kept: 12% faster than 2 workers", "tuning in place is off: ..."
    prefetch_factor: int | None = None
    phase: str = "in_place"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "InPlaceDecision":
        return cls(num_workers=doc["num_workers"], samples_per_s=doc.get("samples_per_s"),
                   rate_ci=doc.get("rate_ci"), verdict=doc.get("verdict") or "",
                   prefetch_factor=doc.get("prefetch_factor"))


TrialRecord = Union[TrialResult, InPlaceDecision]


def trial_from_dict(doc: dict[str, Any]) -> TrialRecord:
    """The trial a JSON document stands for, by its phase."""
    if doc.get("phase") == "in_place":
        return InPlaceDecision.from_dict(doc)
    return TrialResult.from_dict(doc)


USUAL_AIM_S = 90.0  # what a tune aims at without a limit, unless batches are slow (tune/plan.py)


@dataclass(frozen=True)
class TunePlan:
    """What a tune will measure and how long that takes, said before it is spent (the Plan
    event; tune/plan.py estimates it, NOTE [ A budget in batches ])."""

    seconds_per_batch: float  # one batch made in the main process, as first measured
    trials: int  # trials planned in all, those already measured included
    estimated_s: float  # the whole tune, time already spent included
    spent_s: float  # when the plan was made
    predicted_workers: int | None = None  # the count the cost model points to, once known
    budget_s: float | None = None  # the user's hard limit; None: the plan runs to its end
    at_most_s: float | None = None  # every trial at its cap's batches, the end's widest claim
    floor_s: float | None = None  # the least a tune of this dataset takes (NOTE [ The floor ])
    # NOTE [ A tune's aim ] (tune/plan.py): the time aimed at where the whole plan takes longer
    # (estimated_s is then the aim), and the whole plan's estimate
    aim_s: float | None = None
    whole_plan_s: float | None = None
    # NOTE [ Said after the probes ] (tune/plan.py): the plan waits for 0 and 1 worker, measured
    # (estimated_s: when they end); the plan after them says the tune's time
    probing: bool = False

    @property
    def cut_short(self) -> bool:
        """The user's limit, or else the at most first announced (kept as a limit: NOTE [ An at
        most that holds ]), ends the tune before its plan does."""
        limit = self.budget_s if self.budget_s is not None else self.at_most_s
        return limit is not None and self.estimated_s > limit

    def text(self) -> str:
        """One line for the CLI and the page: "each batch takes ~0.95 s ...; this tune needs
        ~3 min (12 trials)"."""
        if self.aim_s is not None and self.whole_plan_s is not None:
            return self._aim_text()
        if self.probing:
            return (f"each batch takes ~{duration(self.seconds_per_batch, fine=True)} in the "
                    f"main process; measuring 0 and 1 worker first (~"
                    f"{duration(max(self.estimated_s - self.spent_s, 0.0))}), then it says how "
                    "long the tune takes"
                    + (f", at most ~{duration(self.at_most_s)}" if self.at_most_s else ""))
        expected, most = spoken_range(self.estimated_s,
                                      None if self.cut_short else self.at_most_s)
        line = (f"each batch takes ~{duration(self.seconds_per_batch, fine=True)} in the main "
                f"process; this tune needs ~{expected}"
                + (f", ~{most} if every trial runs to its cap" if most else "")
                + f" ({self.trials} trials"
                + (f", reaching {self.predicted_workers} workers, the count the cost model "
                   "predicts" if self.predicted_workers else
                   ": the cost model predicts loading in the main process"
                   if self.predicted_workers == 0 else "") + ")"
                + (f"; the least any tune of it can take here is ~{duration(self.floor_s)}"
                   if self.floor_s else ""))
        if self.cut_short:
            limit = (f"your limit of {duration(self.budget_s)}" if self.budget_s is not None
                     else f"the ~{duration(self.at_most_s or 0.0)} it first announced as its most")
            line += f"; {limit} will cut it short (the pick then says what it did not reach)"
        return line

    def _aim_text(self) -> str:
        """The line of a tune whose whole plan takes longer than it aims at (NOTE [ A tune's
        aim ]): the aim, why where it is longer than usual, and how to run the whole plan."""
        aim, whole = duration(self.aim_s or 0.0), duration(self.whole_plan_s or 0.0)
        counts = (f"0, 1 and {self.predicted_workers} workers, the count the cost model "
                  "predicts" if self.predicted_workers and self.predicted_workers > 1 else
                  "0 and 1 worker and the count the cost model will predict"
                  if self.predicted_workers is None else "0 and 1 worker")
        slow = (self.aim_s or 0.0) > 1.05 * USUAL_AIM_S
        return (f"each batch takes ~{duration(self.seconds_per_batch, fine=True)} in the main "
                f"process; this tune aims at ~{aim}"
                + (f", at most ~{duration(self.at_most_s)}" if self.at_most_s else "")
                + (f", past the usual ~{duration(USUAL_AIM_S)}: at that batch time the counts "
                   "it must see and a pair for its claim need it" if slow else "")
                + f" ({counts}, then the claim; its whole plan, {self.trials} trials with "
                  f"every neighbour, repeat and check, would take ~{whole}: --budget-s "
                  f"{math.ceil(self.whole_plan_s or 0.0)} runs it)"
                + (f"; the least any tune of it can take here is ~{duration(self.floor_s)}"
                   if self.floor_s else ""))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "TunePlan":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


def spoken_range(expected_s: float, at_most_s: float | None) -> tuple[str, str | None]:
    """A plan's estimate and its at most as said (``duration``); the at most None where it
    says the same."""
    expected = duration(expected_s)
    most = duration(at_most_s) if at_most_s else None
    return expected, most if most != expected else None


def duration(seconds: float, fine: bool = False) -> str:
    """``0.95 s``, ``40 s``, ``3 min``, ``1.5 h``: as a person says a wait."""
    if fine and seconds < 10:
        return f"{seconds:.2g} s" if seconds >= 0.01 else f"{seconds * 1000:.2g} ms"
    if seconds < 90:
        return f"{max(round(seconds), 1)} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
