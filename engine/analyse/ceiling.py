"""The ceiling: the most samples/s this machine can make for this dataset with any loader
settings, which limit binds there, and what would raise it (a stage cheaper, more cores).

NOTE [ The ceiling and what would raise it ]

    A batch's cost, as the tune's cost model learnt it (tune/costmodel.py) or a run measured it:
    ``worker_cpu_ms`` of CPU to make it in a worker (fetch, transforms, collate: pickling it into
    shared memory is the worker's feeder thread's, outside it), ``worker_ms`` of a worker's
    time for it (CPU and waiting), ``receive_ms`` for the main process to take it from a
    worker, ``step_ms`` for the step, which takes the CPU too where it runs there
    (``step_on_cpu``), and ``serial_ms`` for all of it in the main process (num_workers=0).
    With enough workers, batches/s is bounded by

        cpu:           cpus / (worker_cpu_ms + main process's CPU per batch)
        main process:  1 / (receive_ms + step_ms)   (it receives and steps one batch at a time:
                                                     its busiest thread's CPU, where read)
        workers:       max_workers / worker_ms        (the most workers the user allows)

    and without workers by 1 / serial_ms; ``cpus``, in a tune, the cores its loader used where
    its workers filled them (tune/costmodel.py's at_busy_cores), not their count. The ceiling
    is the best of the two ways. A change to the samples (a stage at half its cost, or none)
    scales ``worker_cpu_ms`` by the stage's share of the making's CPU (the loader's less its
    hand-off and pinning, which that figure does not hold: read as a share of all of it,
    "decode_sample gone" was predicted 1.44x where plain loops made 1.56-1.70x), and
    ``worker_ms`` and ``serial_ms`` by its share of the time;
    more cores scale ``cpus``. Each prediction is bounded by the limits the change leaves alone
    (a cheaper decode stops paying where the main process binds), not a bare Amdahl fraction.
    Shares come from the sampled profile (analyse/hotspots.py): they are the loader's time,
    hand-off included, so a stage's share of a batch's cost is read the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

AT_CEILING = 0.9  # measured this close to the ceiling: more of the loader's knobs will not pay
MIN_SHARE = 0.05  # a stage or function under this share is not worth a what-if
ALL_OF_IT = 0.9  # a stage or function holding this much is the whole loader, not a part
FUNCTIONS = 3  # the top functions given a what-if, beside the stages
MORE_CORES = (2, 4)  # "2x / 4x the usable CPUs"


@dataclass(frozen=True)
class BatchCost:
    """One batch's cost (NOTE [ The ceiling and what would raise it ]), in ms."""

    serial_ms: float
    worker_ms: float
    worker_cpu_ms: float
    receive_ms: float
    step_ms: float
    step_on_cpu: bool
    cpus: float  # usable by this loader: cgroup quota, affinity, the node's other ranks
    samples_per_batch: float
    max_workers: int
    # False for a run without workers: a worker's hand-off to the main process is not seen
    # there, and ``receive_ms`` holds only the main loop's own time
    receive_seen: bool = True
    # the main process's CPU a batch in all its threads (the cpu limit counts the larger of it
    # and the turn's): threads working beside the one that takes turns take cores, not turns
    main_cpu_ms: float | None = None
    # a worker's own time making a batch (fetch and collate) where ``worker_ms`` is its whole
    # cycle (the tune's: the hand-off included), which waiting_share reads: a worker that waits
    # for the main process to take its batch is not waiting for storage
    making_ms: float | None = None

    @property
    def making(self) -> float:
        """A worker's own time making a batch: ``making_ms`` where given, else ``worker_ms``."""
        return self.worker_ms if self.making_ms is None else self.making_ms

    def limits(self) -> dict[str, float]:
        """samples/s each limit allows (``step_demand`` only with a step)."""
        main_cpu = max(self.receive_ms + (self.step_ms if self.step_on_cpu else 0.0),
                       self.main_cpu_ms or 0.0)
        per_batch = {
            "cpu": self.cpus * 1000.0 / max(self.worker_cpu_ms + main_cpu, 1e-6),
            "main_process": 1000.0 / max(self.receive_ms + self.step_ms, 1e-6),
            "workers": self.max_workers * 1000.0 / max(self.worker_ms, 1e-6),
            "without_workers": 1000.0 / max(self.serial_ms, 1e-6),
        }
        if self.step_ms > 0:
            per_batch["step_demand"] = 1000.0 / self.step_ms
        return {name: rate * self.samples_per_batch for name, rate in per_batch.items()}

    def ceiling(self) -> tuple[float, str]:
        """(samples/s, the binding limit)."""
        limits = self.limits()
        with_workers = {k: limits[k] for k in ("cpu", "main_process", "workers")}
        binding = min(with_workers, key=with_workers.__getitem__)
        rate = with_workers[binding]
        if limits["without_workers"] >= rate:
            return limits["without_workers"], "without_workers"
        if binding == "main_process" and self.step_ms > self.receive_ms:
            binding = "step"  # the main process's time is mostly the step's
        return rate, binding

    def cheaper(self, time_share: float, cpu_share: float, by: float,
                serial_share: float | None = None) -> "BatchCost":
        """The batch with a part of the loader's work (``time_share`` of its time,
        ``cpu_share`` of its CPU) cut by ``by`` (0.5: half; 1: none of it); ``serial_share``:
        its share of a batch made without workers, where that differs (``share_without``)."""
        serial = time_share if serial_share is None else serial_share
        return replace(self, serial_ms=self.serial_ms * (1 - serial * by),
                       worker_ms=self.worker_ms * (1 - time_share * by),
                       making_ms=(None if self.making_ms is None
                                  else self.making_ms * (1 - time_share * by)),
                       worker_cpu_ms=self.worker_cpu_ms * (1 - cpu_share * by))


# What would raise a ceiling, by the limit that binds it (said after "will not pay")
RAISED_BY = {
    "cpu": ", cheaper samples or more cores would",
    "workers": ", more workers than allowed might (--max-workers)",
    "main_process": ", a cheaper hand-off would (smaller batches, fewer Python objects in them)",
    "step": "",  # the step is the limit: loading faster does not speed training
    "without_workers": ", cheaper samples would",
}


@dataclass(frozen=True)
class Ceiling:
    samples_per_s: float
    binding: str  # cpu | main_process | step | workers | without_workers
    limits: dict[str, float]
    step_demand_samples_per_s: float | None
    measured_samples_per_s: float | None  # the best measured (the pick's, the run's)
    cpus: float
    receive_seen: bool = True  # (BatchCost's)

    @property
    def at_ceiling(self) -> bool:
        return (self.measured_samples_per_s is not None
                and self.measured_samples_per_s >= AT_CEILING * self.samples_per_s)

    def sentence(self) -> str:
        """One sentence: where the loader stands against the ceiling, and why."""
        why = {
            "cpu": f"the {_cpus(self.cpus)} usable CPUs are busy making batches",
            "main_process": "the main process takes one batch at a time from the workers",
            "step": "your step takes the main process's time: faster loading will not speed "
                    "training",
            "workers": "the most workers allowed are all busy",
            "without_workers": "without workers, the main process makes batches faster than "
                               "workers could hand them over",
        }[self.binding]
        ceiling = f"~{self.samples_per_s:,.0f} samples/s"
        if not self.receive_seen and self.binding != "without_workers":
            why += ("; measured without workers, where their hand-off to the main process "
                    "is not seen: it is left out")
        if self.measured_samples_per_s is None:
            return f"This machine can make {ceiling} for this dataset at most: {why}."
        measured = f"{self.measured_samples_per_s:,.0f} samples/s"
        if self.at_ceiling:
            of = ("of the " if self.measured_samples_per_s < self.samples_per_s
                  else "against the model's ")  # (the model is an estimate: it may be passed)
            return (f"At its ceiling: {measured} {of}{ceiling} this machine can make for "
                    f"this dataset ({why}); other loader settings will not pay"
                    + RAISED_BY[self.binding] + ".")
        return (f"Below its ceiling: {measured} of the {ceiling} this machine can make for "
                f"this dataset (there, {why}).")

    def to_dict(self) -> dict[str, Any]:
        return {"samples_per_s": round(self.samples_per_s, 1), "binding": self.binding,
                "limits": {k: round(v, 1) for k, v in self.limits.items()},
                "step_demand_samples_per_s": (None if self.step_demand_samples_per_s is None
                                              else round(self.step_demand_samples_per_s, 1)),
                "measured_samples_per_s": (None if self.measured_samples_per_s is None
                                           else round(self.measured_samples_per_s, 1)),
                "at_ceiling": self.at_ceiling, "sentence": self.sentence()}


STEP_ON_CPU = 0.8  # a loop's main process using this much CPU of its step's time: a CPU step


def _cpus(cpus: float) -> str:
    """2 -> "2", 1.85 -> "1.8": a budget less the other load is rarely whole."""
    return f"{cpus:.1f}".rstrip("0").rstrip(".")


def measured_cost(per_batch: dict[str, Any] | None, main_cpu_pct: float | None,
                  batches_per_s: float | None, samples_per_s: float | None, step_ms: float,
                  consumer: str, cpus: float, num_workers: int,
                  max_workers: int, busiest_thread_pct: float | None = None) -> BatchCost | None:
    """A batch's cost as one run measured it (a profile, a watched job): the fetch and the
    collate (their CPU, their time: in each worker, or in the main process at num_workers=0)
    and the main process's CPU a batch (receiving it, and the step where it runs there: a
    ``train_step`` does; a job's own loop does where its process used the CPU through it, not
    where it waited on a GPU). What takes batches from workers one at a time is one thread, so
    the main process's limit reads its busiest thread (``busiest_thread_pct``) where known, and
    the cpu limit all its threads. Without workers, what receiving a batch from a worker costs is
    not seen (``receive_seen``): the main process's CPU less the making is its loop's own.
    None where a figure is missing."""
    if (not per_batch or per_batch.get("fetch_cpu_ms") is None or main_cpu_pct is None
            or not batches_per_s or not samples_per_s):
        return None
    collate = per_batch.get("collate_ms") or 0.0
    worker_ms = per_batch["fetch_ms"] + collate
    worker_cpu_ms = per_batch["fetch_cpu_ms"] + collate
    main_ms = 10.0 * main_cpu_pct / batches_per_s  # (cpu_percent / 100 * 1000 ms)
    if num_workers == 0:  # the making is the main process's own CPU there (the fetch's CPU
        # is the whole process's: less the busiest thread's would read too little)
        main_ms = max(main_ms - worker_cpu_ms, 0.0)
        loop_ms = main_ms
    else:
        loop_ms = main_ms if busiest_thread_pct is None else min(
            10.0 * busiest_thread_pct / batches_per_s, main_ms)
    step_on_cpu = consumer == "train_step" or (  # (all its threads: a step may use many)
        consumer == "training_loop" and step_ms > 0 and main_ms >= STEP_ON_CPU * step_ms)
    receive_ms = max(loop_ms - (step_ms if step_on_cpu else 0.0), 0.01)
    # what takes one batch at a time took no longer than a batch's interval: it kept up
    receive_ms = min(receive_ms, max(1000.0 / batches_per_s - step_ms, 0.01))
    # (without workers a batch's whole time is measured: the step's CPU is in the loop's too)
    serial_ms = worker_ms + step_ms if num_workers else 1000.0 / batches_per_s
    return BatchCost(serial_ms=serial_ms, worker_ms=worker_ms,
                     worker_cpu_ms=worker_cpu_ms, receive_ms=receive_ms,
                     step_ms=step_ms, step_on_cpu=step_on_cpu, cpus=cpus,
                     samples_per_batch=samples_per_s / batches_per_s, max_workers=max_workers,
                     receive_seen=num_workers > 0, main_cpu_ms=main_ms)


def share_without(share: float, stage: str | None, sampled: dict[str, Any]) -> float:
    """A part's share of a batch made without workers, from its share of the profile's loader
    time: a worker's hand-off to the main process is not there (a 0-worker pick's profile,
    merged with the search's trials with workers, held 62% hand-off for noisy_worker, and
    "hand-off gone" predicted 3.09x for a pick that has none), the rest fills its place."""
    if stage == "hand-off":
        return 0.0
    handoff = sum(s["share"] for s in sampled["stages"] if s["stage"] == "hand-off")
    return min(share / (1.0 - handoff), 1.0) if handoff < 1.0 else 0.0


NOT_FETCH = ("collate", "hand-off", "pinning")  # what a cache of each sample's output still pays
NOT_MAKING = ("hand-off", "pinning")  # outside a worker's fetch and collate (worker_cpu_ms)


def share_of_making(share: float, stage: str | None, sampled: dict[str, Any],
                    key: str = "share") -> float:
    """A part of the making's share of it (``key``: "share" of the time, "cpu_share"), from
    its share of the profile's loader work, which holds the hand-off and pinning beside: the
    share by which it cuts ``worker_cpu_ms``. A part of the hand-off or pinning as given."""
    if stage in NOT_MAKING:
        return share
    stages = sampled["stages"]
    total = sum(s[key] for s in stages)
    making = sum(s[key] for s in stages if s["stage"] not in NOT_MAKING)
    return min(share * total / making, 1.0) if making > 0 else share


def cached_prediction(cost: BatchCost, sampled: dict[str, Any] | None,
                      num_workers: int) -> float | None:
    """samples/s at ``num_workers`` with every sample's making gone (a cache of each sample's
    output in RAM): the fetch stages' share off the batch, collate and hand-off kept."""
    if not sampled or not sampled.get("enough"):
        return None
    fetch = [s for s in sampled["stages"] if s["stage"] not in NOT_FETCH]
    cpu_total = sum(s["cpu_share"] for s in sampled["stages"]) or 1.0
    share = sum(s["share"] for s in fetch)
    changed = cost.cheaper(share, share_of_making(
        sum(s["cpu_share"] for s in fetch) / cpu_total, None, sampled, "cpu_share"), 1.0,
        share_without(share, None, sampled))
    limits = replace(changed, max_workers=max(num_workers, 1)).limits()
    if num_workers == 0:
        return limits["without_workers"]
    return min(limits["cpu"], limits["main_process"], limits["workers"])


MAX_THREADS = 16
WAITING = 0.5  # the fetch this much off the CPU (of its time): waiting, worth overlapping


def waiting_share(cost: BatchCost) -> float:
    """The share of a worker's time for a batch spent off the CPU (waiting for storage,
    sleeping): from the cost model, not the sampled profile, whose looks come with CPU used
    and are few where a loader mostly waits."""
    return max(1.0 - cost.worker_cpu_ms / cost.making, 0.0) if cost.making > 0 else 0.0


def threads_for(cost: BatchCost, batch_size: int | None) -> int | None:
    """How many threads would overlap the fetch's waits (a batch's time over its CPU: one
    that waits 9 parts in 10 keeps 10 busy), at most a batch's samples and MAX_THREADS; None
    where the loader mostly works (threads would not pay) or a batch is one sample."""
    if not batch_size or batch_size < 2 or waiting_share(cost) < WAITING:
        return None
    busy = max(cost.worker_cpu_ms, cost.making / MAX_THREADS)
    return max(2, min(math.ceil(cost.making / busy), batch_size, MAX_THREADS))


def threaded_prediction(cost: BatchCost, num_workers: int, threads: int) -> float:
    """samples/s at ``num_workers`` with the waits overlapped ``threads`` ways (the waiting
    share of a batch's time cut by 1 - 1/threads, its CPU kept), bounded by the limits."""
    changed = cost.cheaper(waiting_share(cost), 0.0, 1.0 - 1.0 / threads)
    limits = replace(changed, max_workers=max(num_workers, 1)).limits()
    if num_workers == 0:
        return limits["without_workers"]
    return min(limits["cpu"], limits["main_process"], limits["workers"])


THREADS_CHANGE = "threads fetching each batch"  # a measured row's change (fixes.py finds it)


def threads_change(threads: int, num_workers: int) -> str:
    where = "in each worker" if num_workers else "in the main process"
    return f"{threads} {THREADS_CHANGE} {where} (measured)"


def measured_row(change: str, predicted: float | None, measured: float,
                 uncertainty_pct: float | None, now: float | None, caveat: str
                 ) -> dict[str, Any]:
    """The what-if row of a change the tune measured (a cache, threads fetching) beside its
    prediction, with how well the measured rate is known (its trials' 95% interval or spread,
    in %) and what must hold for the job to have it (``caveat``)."""
    return {"change": change, "stage": None, "function": None, "caveat": caveat,
            "predicted_samples_per_s": None if predicted is None else round(predicted, 1),
            "predicted_gain": round((predicted or measured) / now, 3) if now else math.nan,
            "then_binding": "", "measured_samples_per_s": round(measured, 1),
            "measured_uncertainty_pct": (None if uncertainty_pct is None
                                         else round(uncertainty_pct, 1))}


def ceiling_of(cost: BatchCost, measured: float | None) -> Ceiling:
    rate, binding = cost.ceiling()
    limits = cost.limits()
    return Ceiling(rate, binding, limits, limits.get("step_demand"), measured, cost.cpus,
                   cost.receive_seen)


def what_if(cost: BatchCost, sampled: dict[str, Any] | None,
            measured: float | None) -> list[dict[str, Any]]:
    """Each top stage and function at half its cost and at none, and more cores, as
    predictions bounded by the other limits; ranked by predicted gain over the measured best
    (or the ceiling). ``sampled``: hotspots.py's merged stacks (its stages and functions)."""
    now = measured or cost.ceiling()[0]
    changes: list[tuple[str, str | None, str | None, BatchCost]] = []
    if sampled and sampled.get("enough"):
        cpu_total = sum(s["cpu_share"] for s in sampled["stages"]) or 1.0
        for stage in sampled["stages"]:
            if MIN_SHARE <= stage["share"] < ALL_OF_IT:
                cpu = share_of_making(stage["cpu_share"] / cpu_total, stage["stage"], sampled,
                                      "cpu_share")
                for by, said in ((0.5, "at half its cost"), (1.0, "gone")):
                    changes.append((f"{stage['stage']} {said}", stage["stage"], None,
                                    cost.cheaper(stage["share"], cpu, by, share_without(
                                        stage["share"], stage["stage"], sampled))))
        parts = [h for h in sampled["hotspots"] if MIN_SHARE <= h["total_share"] < ALL_OF_IT]
        for function in parts[:FUNCTIONS]:
            share = function["total_share"]
            serial = share_without(share, function["stage"], sampled)
            for by, said in ((0.5, "at half its cost"), (1.0, "gone")):
                changes.append((f"{function['function']} {said}", function["stage"],
                                function["function"], cost.cheaper(share, share_of_making(
                                    share, function["stage"], sampled), by, serial)))
    for times in MORE_CORES:
        changes.append((f"{times}x the usable CPUs (~{cost.cpus * times:.0f})", None, None,
                        replace(cost, cpus=cost.cpus * times)))
    rows = []
    for change, stage, function, changed in changes:
        rate, binding = changed.ceiling()
        rows.append({"change": change, "stage": stage, "function": function,
                     "predicted_samples_per_s": round(rate, 1),
                     "predicted_gain": round(rate / now, 3) if now else math.nan,
                     "then_binding": binding, "measured_samples_per_s": None})
    return sorted(rows, key=lambda r: -r["predicted_gain"])
