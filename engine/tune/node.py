"""Tune in place a node at a time: the ranks of a node switch settings together.

A node's ranks share its cores, memory bandwidth and /dev/shm: a worker count tried on one rank
while the others keep theirs is measured under the wrong contention, and ranks searching on
their own end on different settings. So under torchrun, with ``tune=True`` and the job's store
reachable (job_report.job_store), local rank 0 of each node leads: it runs the search
(in_place.py) on its own loop's rate and announces each switch to its node's other ranks through
the job's store, as a ``NodePlan``: the setting and the batch of the epoch from which it runs,
PLAN_LEAD_S ahead at the loop's pace, so every rank switches at the same batch. In a
data-parallel job every rank's loop runs at the pace of the slowest (they meet at each
all-reduce), so the leader's rate is the node's slowest rank's; ranks that do not
synchronise report their pace under each setting (their time per steady batch), and the leader
counts each of its batches at the slowest rank's pace. The other ranks follow the plan (at once
if they learn of it late) and never search themselves; one whose tried setting fails goes back
to the job's own and tells the leader, which drops that setting for the node.

``LeaderSearch`` and ``FollowerSearch`` answer the loader as ``InPlaceSearch`` does (the
loader's swapping of batches between settings is unchanged, loader.py); the store is read and
written on a thread of their own, never by the training loop.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from dataloader_tuner.record.trials import InPlaceDecision
from dataloader_tuner.config import TunedSettings
from dataloader_tuner.tune.in_place import InPlaceSearch, log_line
from dataloader_tuner.tune.in_place_trial import Trial
from dataloader_tuner.analyse.ranks import report_key

PLAN_LEAD_S = 1.0  # a switch is announced this far ahead of the batch it applies from
POLL_S = 0.2  # how often the node's plan (followers) or failures (the leader) are read
# A follower that has heard no plan by its third tuned epoch (no store, or local rank 0 is not
# tuning) stops following and runs the job's own setting as an untuned loader.
UNHEARD_EPOCHS = 2


@dataclass(frozen=True)
class NodePlan:
    version: int  # one more with each announcement
    epoch: int  # the loader's epoch ...
    from_batch: int  # ... and its batch from which ``setting`` runs
    setting: TunedSettings
    finished: bool  # the search is over: this is the node's choice

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "setting": asdict(self.setting)})

    @classmethod
    def from_json(cls, text: str | bytes) -> "NodePlan":
        data = json.loads(text)
        return cls(**{**data, "setting": TunedSettings(**data["setting"])})


class NodeStore(Protocol):
    """What is used of the job's key-value store (torch.distributed's Store)."""

    def set(self, key: str, value: str, /) -> None: ...
    def get(self, key: str, /) -> bytes: ...
    def check(self, keys: list[str], /) -> bool: ...


def plan_key(loader: str, node: int) -> str:
    return report_key(loader, f"node{node}/plan")


def failure_key(loader: str, node: int, local_rank: int) -> str:
    return report_key(loader, f"node{node}/failed/{local_rank}")


def pace_key(loader: str, node: int, local_rank: int) -> str:
    return report_key(loader, f"node{node}/pace/{local_rank}")


class Pace:
    """A rank's loop under the setting it runs: steady batches (after each loader's warm-up)
    and the seconds they took, for the plan version that setting came with."""

    def __init__(self) -> None:
        self.version, self.batches, self.seconds, self.seen = 0, 0, 0.0, 0

    def restart(self, version: int) -> None:
        self.version, self.batches, self.seconds, self.seen = version, 0, 0.0, 0

    def add(self, cycle_s: float, warmup: int) -> None:
        self.seen += 1
        if self.seen > warmup:
            self.batches += 1
            self.seconds += cycle_s

    def per_batch(self) -> float | None:
        return self.seconds / self.batches if self.batches >= 3 else None


class _StoreThread:
    """Reads and writes the node's keys every POLL_S on a thread of its own."""

    def __init__(self, connect: Callable[[], NodeStore | None], name: str) -> None:
        self.connect = connect
        self._store: NodeStore | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._round()  # what is left to say (the leader's last plan), once more

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S) and not self.done():
            self._round()
        self._round()

    def _round(self) -> None:
        try:
            self._store = self._store or self.connect()
            if self._store is not None:
                self.exchange(self._store)
        except Exception:  # noqa: BLE001 - the node's ranks keep their settings meanwhile
            self._store = None

    def done(self) -> bool:
        """Nothing more to read or say: the thread ends."""
        raise NotImplementedError

    def exchange(self, store: NodeStore) -> None:
        raise NotImplementedError


class LeaderSearch(_StoreThread):
    """Local rank 0's search, announced to its node."""

    def __init__(self, search: InPlaceSearch, loader: str, node: int, local_world_size: int,
                 connect: Callable[[], NodeStore | None]) -> None:
        super().__init__(connect, "dataloader-tuner-node-leader")
        self.search, self.loader, self.node = search, loader, node
        self.local_world_size = local_world_size
        self.epoch, self.index = 0, 0  # the batch of the epoch the loop is at
        self.pending: NodePlan | None = None  # announced, not yet reached
        self.version = 0
        self._outbox: list[NodePlan] = []
        self._failures: list[tuple[TunedSettings, str]] = []  # reported by followers
        self._seen_failures: set[str] = set()
        self._running = search.current  # what this rank's loader runs now
        self._cycles: list[float] = []
        self.pace = Pace()  # this rank's, under the plan version running
        self.paces: dict[int, tuple[int, int, float]] = {}  # follower -> (version, n, seconds)

    # -- what loader.py asks ----------------------------------------------------------------

    @property
    def current(self) -> TunedSettings:
        return self._running

    @property
    def baseline(self) -> TunedSettings:
        return self.search.baseline

    @property
    def finished(self) -> bool:
        return self.search.finished and self.pending is None

    @property
    def decisions(self) -> list[InPlaceDecision]:
        return self.search.decisions

    @property
    def measured(self) -> list[Trial]:
        return self.search.measured

    @property
    def best(self) -> Trial | None:
        return self.search.best

    def epoch_started(self, epoch: int) -> None:
        self.epoch, self.index = epoch, 0
        if self.pending is not None:  # announced for the last epoch's end: from its start
            self._switch(self.pending)

    def loader_started(self) -> None:
        self.search.loader_started()
        self.pace.seen = 0

    def _switch(self, plan: NodePlan) -> TunedSettings:
        self._running, self.pending = plan.setting, None
        self.pace.restart(plan.version)
        return self._running

    def slowest_factor(self) -> float:
        """How much slower the node's slowest rank runs this setting than this one (1 when
        none is slower, or too little is known): the search judges the node by it."""
        own = self.pace.per_batch()
        theirs = [seconds / batches for version, batches, seconds in self.paces.values()
                  if version == self.pace.version and batches >= 3]
        if own is None or not theirs:
            return 1.0
        return max(1.0, max(theirs) / own)

    def after_batch(self, samples: int, cycle_s: float, wait_s: float | None = None
                    ) -> TunedSettings | None:
        self.index += 1
        self._cycles.append(cycle_s)
        del self._cycles[:-32]
        self.pace.add(cycle_s, self._running.warmup_batches)
        running = self._running
        while self._failures:  # failed on another rank
            setting, why = self._failures.pop(0)
            if setting in self.search.failed:
                continue
            pending = self.pending.setting if self.pending is not None else None
            if setting in (self._running, pending, self.search.current):
                self.setting_failed(setting, why)  # the node leaves it at once
            else:  # a setting measured before: never tried again
                self.search.failed.add(setting)
                self.search.decisions.append(log_line(setting, None, None,
                                                      f"failed {why}; not tried again"))
        if self._running != running:
            return self._running
        if self.pending is not None:
            if self.index < self.pending.from_batch:
                return None  # the old setting runs until the node switches together
            return self._switch(self.pending)
        if self.search.finished:
            return None
        # Each batch counted at the pace of the node's slowest rank under this setting.
        slowest = self.slowest_factor()
        switch = self.search.after_batch(samples, cycle_s * slowest,
                                         None if wait_s is None else wait_s * slowest)
        if self.search.finished and switch is None:
            self._publish(self._running)  # the choice is what runs now: the node keeps it
        elif switch is not None:
            self._announce(switch)
        return None

    def setting_failed(self, setting: TunedSettings, why: str) -> TunedSettings:
        fallback = self.search.setting_failed(setting, why)
        self._switch(self._publish(fallback))  # from now on, on every rank of the node
        return fallback

    # -- announcing ------------------------------------------------------------------------

    def _announce(self, setting: TunedSettings) -> None:
        """A switch for the whole node, PLAN_LEAD_S ahead."""
        per_batch = sum(self._cycles) / len(self._cycles) if self._cycles else 0.0
        lead = max(2, round(PLAN_LEAD_S / per_batch)) if per_batch > 0 else 2
        self.pending = self._publish(setting, lead)

    def _publish(self, setting: TunedSettings, lead: int = 0) -> NodePlan:
        self.version += 1
        plan = NodePlan(self.version, self.epoch, self.index + lead, setting,
                        self.search.finished)
        self._outbox.append(plan)
        return plan

    def done(self) -> bool:
        return self.search.finished and self.pending is None and not self._outbox

    def exchange(self, store: NodeStore) -> None:
        while self._outbox:
            store.set(plan_key(self.loader, self.node), self._outbox[0].to_json())
            self._outbox.pop(0)
        for local_rank in range(1, self.local_world_size):
            key = pace_key(self.loader, self.node, local_rank)
            if store.check([key]):
                pace = json.loads(store.get(key))
                self.paces[local_rank] = (pace["version"], pace["batches"], pace["seconds"])
            key = failure_key(self.loader, self.node, local_rank)
            if store.check([key]):
                text = store.get(key).decode()
                if text not in self._seen_failures:
                    self._seen_failures.add(text)
                    report = json.loads(text)
                    self._failures.append((TunedSettings(**report["setting"]),
                                           f"on local rank {local_rank}: {report['why']}"))


class FollowerSearch(_StoreThread):
    """Any other rank of the node: runs what the node's plan says, when it says."""

    def __init__(self, baseline: TunedSettings, loader: str, node: int, local_rank: int,
                 connect: Callable[[], NodeStore | None]) -> None:
        super().__init__(connect, "dataloader-tuner-node-follower")
        self.baseline = baseline
        # Its keys in the store: where it reports a failure and its pace, where it reads plans
        self._keys = (failure_key(loader, node, local_rank), pace_key(loader, node, local_rank),
                      plan_key(loader, node))
        self.epoch, self.index = 0, 0
        self.latest: NodePlan | None = None  # the newest plan read from the store
        self.applied = 0  # the version of the plan running
        self._running = baseline
        self.decisions: list[InPlaceDecision] = []
        self.finished = False
        self.best: Trial | None = None
        self._outbox: list[str] = []
        self._epochs = 0  # tuned epochs begun
        self.pace = Pace()  # reported to the leader, who judges the node by its slowest
        self._pace_sent: tuple[int, int, float] | None = None

    @property
    def current(self) -> TunedSettings:
        return self._running

    @property
    def measured(self) -> Sequence[Trial]:
        """Nothing: the node's leader measures, for every rank."""
        return ()

    def epoch_started(self, epoch: int) -> None:
        self.epoch, self.index = epoch, 0
        self._epochs += 1
        plan = self.latest
        if plan is not None and plan.version > self.applied and plan.epoch < epoch:
            self._apply(plan)
        elif self.latest is None and self._epochs > UNHEARD_EPOCHS:
            self.finished, self.best = True, Trial(self.baseline)
            self._running = self.baseline
            self.decisions.append(log_line(self.baseline, None, None,
                                           f"no plan from the node's local rank 0 in "
                                           f"{UNHEARD_EPOCHS} epochs (no store, or it is not "
                                           "tuning): the job's own setting, untuned"))

    def loader_started(self) -> None:
        self.pace.seen = 0

    def after_batch(self, samples: int, cycle_s: float, wait_s: float | None = None
                    ) -> TunedSettings | None:
        self.index += 1
        self.pace.add(cycle_s, self._running.warmup_batches)
        plan = self.latest
        if self.finished or plan is None or plan.version <= self.applied:
            return None
        if plan.epoch > self.epoch or (plan.epoch == self.epoch and self.index < plan.from_batch):
            return None
        return self._apply(plan)

    def setting_failed(self, setting: TunedSettings, why: str) -> TunedSettings:
        self._outbox.append(json.dumps({"setting": asdict(setting), "why": why}))
        self.decisions.append(log_line(setting, None, None,
                                       f"failed on this rank ({why}); back to the job's own "
                                       "setting until the node's leader announces another"))
        self._running = self.baseline
        return self.baseline

    def _apply(self, plan: NodePlan) -> TunedSettings | None:
        self.applied = plan.version
        self.pace.restart(plan.version)
        changed = plan.setting != self._running
        self._running = plan.setting
        verdict = (f"chosen by the node's local rank 0: num_workers={plan.setting.num_workers}"
                   if plan.finished else
                   f"switched with the node (local rank 0 leads the search), epoch {plan.epoch} "
                   f"batch {plan.from_batch}")
        self.decisions.append(log_line(plan.setting, None, None, verdict))
        if plan.finished:
            self.finished, self.best = True, Trial(plan.setting)
        return plan.setting if changed else None

    def done(self) -> bool:
        return self.finished and not self._outbox

    def exchange(self, store: NodeStore) -> None:
        failure, pace_at, plan_at = self._keys
        while self._outbox:
            store.set(failure, self._outbox[0])
            self._outbox.pop(0)
        pace = (self.pace.version, self.pace.batches, round(self.pace.seconds, 6))
        if pace != self._pace_sent and not self.finished:
            store.set(pace_at, json.dumps(dict(zip(("version", "batches", "seconds"), pace))))
            self._pace_sent = pace
        if store.check([plan_at]):
            plan = NodePlan.from_json(store.get(plan_at))
            if self.latest is None or plan.version > self.latest.version:
                self.latest = plan
