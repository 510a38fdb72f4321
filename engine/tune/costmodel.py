"""The dataset's cost profile, learnt from the first two trials, and what it predicts.

A Plumber-style rate model with three limits on batches per second for ``n`` workers:

    workers:  n / cycle          each worker makes one batch per cycle (fetch, collate, hand-off)
    CPU:      cpus / cpu_cost    all CPU work per batch (workers' and the main process's)
                                 shares the cores this loader may use
    consumer: 1 / main_serial    the main process receives each batch and runs the step, serially
                                 (its busiest thread's CPU, where read: threads beside the
                                 loop's, such as torch's pool copying pinned batches, run
                                 alongside it)

Throughput is the smallest of the three. CPU-bound Python hits the CPU limit near the core count;
waiting (I/O, sleeps) uses little CPU, so the worker limit keeps rising far past it; tiny
in-memory samples hit the consumer limit at once, where workers only add hand-off cost and
``num_workers=0`` wins. The model only proposes where to look: every pick is measured.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

from dataloader_tuner.analyse.ceiling import BatchCost
from dataloader_tuner.record.trials import TrialResult

PEAK_SHARE = 0.97  # workers enough to reach this share of the binding limit count as "the peak"


@dataclass(frozen=True)
class CostProfile:
    serial_ms: float  # one batch with num_workers=0, step included (the main process does all)
    cycle_ms: float  # one worker's time per batch, hand-off included (from the 1-worker trial)
    worker_ms: float  # fetch + collate inside the worker
    worker_cpu_ms: float  # CPU of that work
    main_cpu_ms: float  # main-process CPU per batch with workers
    step_ms: float  # the consumer's step per batch (0 without one)
    step_on_cpu: bool  # a train_step in this process uses the CPU; a simulated step does not
    cpu_budget: float  # cores this loader may use
    batch_bytes: float
    startup_s: float  # first batch after starting one worker
    # its busiest thread's part of main_cpu_ms, where read: what the main process does one
    # batch at a time (torch's pool copying a pinned batch beside it takes cores, not turns)
    main_thread_cpu_ms: float | None = None

    @property
    def cpu_share(self) -> float:
        """CPU time / wall time of the fetch: ~1 is CPU-bound, ~0 is waiting."""
        return min(self.worker_cpu_ms / self.worker_ms, 1.0) if self.worker_ms > 0 else 1.0

    @property
    def make_ms(self) -> float:
        """Making one batch in the main process (num_workers=0), the step taken out."""
        return max(self.serial_ms - self.step_ms, 0.0)

    @property
    def receive_ms(self) -> float:
        """The main process's cost to receive one batch from a worker."""
        return self.main_serial_ms - self.step_ms

    @property
    def main_serial_ms(self) -> float:
        one_at_a_time = min(self.main_cpu_ms, math.inf if self.main_thread_cpu_ms is None
                            else self.main_thread_cpu_ms)
        receive = one_at_a_time - (self.step_ms if self.step_on_cpu else 0.0)
        return max(receive, 0.01) + self.step_ms

    def limits(self, n: int) -> dict[str, float]:
        """Batches/s allowed by each limit with ``n >= 1`` workers."""
        cpu_cost = self.worker_cpu_ms + max(self.main_cpu_ms, 0.01)
        return {
            "workers": n * 1000.0 / self.cycle_ms,
            "cpu": self.cpu_budget * 1000.0 / cpu_cost if cpu_cost > 0 else math.inf,
            "consumer": 1000.0 / self.main_serial_ms,
        }

    def predict(self, n: int) -> float:
        """Predicted batches/s with ``n`` workers."""
        if n == 0:
            return 1000.0 / self.serial_ms
        return min(self.limits(n).values())

    def peak_workers(self, max_workers: int) -> int:
        """The fewest workers predicted to reach ``PEAK_SHARE`` of the best with workers."""
        ceiling = self.limits(1)
        cap = min(ceiling["cpu"], ceiling["consumer"])
        n = math.ceil(PEAK_SHARE * cap * self.cycle_ms / 1000.0)
        return max(1, min(n, max_workers))

    def fed_workers(self, max_workers: int, margin: float = 1.15) -> int:
        """The fewest workers predicted to produce batches faster than the consumer takes them,
        or as fast as the CPUs allow where they bind first (a CPU step and CPU-bound loading
        share the cores: more workers than that only steal the step's)."""
        demand = min(1000.0 / self.main_serial_ms, self.limits(1)["cpu"])
        n = math.ceil(margin * demand * self.cycle_ms / 1000.0)
        return max(1, min(n, max_workers))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_share": self.cpu_share, "main_serial_ms": self.main_serial_ms}

    def cost_from(self, serial: TrialResult, max_workers: int) -> BatchCost:
        """The batch's cost, its samples counted from the 0-worker trial ``serial``."""
        samples_per_batch = (serial.samples_per_s / serial.batches_per_s if serial.batches_per_s
                             else float(serial.batch_size or 1))
        return self.batch_cost(samples_per_batch, max_workers)

    def batch_cost(self, samples_per_batch: float, max_workers: int) -> BatchCost:
        """The batch's cost as the ceiling reads it (analyse/ceiling.py)."""
        return BatchCost(serial_ms=self.serial_ms, worker_ms=self.cycle_ms,
                         worker_cpu_ms=self.worker_cpu_ms, receive_ms=self.receive_ms,
                         step_ms=self.step_ms, step_on_cpu=self.step_on_cpu,
                         cpus=self.cpu_budget, samples_per_batch=samples_per_batch,
                         max_workers=max_workers, main_cpu_ms=self.main_cpu_ms,
                         making_ms=self.worker_ms)


# The trials whose CPU a batch describes the loader itself (not a variant the tune measures
# beside it: threads fetching, freed memory kept, samples cached)
PLAIN_PHASES = ("probe", "search", "confirm", "final")
SATURATED = 0.8  # a trial whose loader used this share of its cores was held by them


def at_busy_cores(profile: CostProfile, trials: list[TrialResult],
                  other_load_at_start: float = 0.0, local_world_size: int = 1) -> CostProfile:
    """The profile as its cpu limit should read it: the CPU a batch (the workers' and the
    main process's) where the workers filled every core the loader may use, and the cores a
    loader got there. With the cores all busy a batch may take more CPU than with one worker;
    and a CPU-bound loader does not keep every core busy (the workers wait on their hand-off,
    a VM's neighbours take their share: here a plain loop of 2 workers left 5% of 2 cores idle
    and 1.4% stolen), so where those trials used at least SATURATED of the cores, what they used
    (their median) is what the cores give (at most the budget plus the other load the start read,
    ``other_load_at_start``, shared by ``local_world_size`` ranks). A CI run read 1,727
    samples/s of "ceiling" for known_stages, 2 cores spinning, where plain loops made at most
    1,500 and the tune's pick 1,536 (tests/test_ceiling_real.py). The medians of those trials;
    the profile as learnt where none filled the cores."""
    busy = [t for t in trials if t.phase in PLAIN_PHASES and t.worker_threads is None
            and not t.keep_freed_memory and t.num_workers >= math.ceil(profile.cpu_budget)
            and t.worker_cpu_ms is not None and t.main_cpu_ms is not None
            and t.worker_ms is not None]
    if not busy:
        return profile
    worker_cpu_ms = statistics.median(min(t.worker_cpu_ms or 0.0, t.worker_ms or 0.0)
                                      for t in busy)
    main_cpu_ms = statistics.median(t.main_cpu_ms or 0.0 for t in busy)
    # (the median: the most any one trial used is one noisy trial's, 1,493 samples/s where the
    # pick made 1,281 and plain loops 1,298 at most)
    used = statistics.median((worker_cpu_ms + main_cpu_ms) / t.ms_per_batch for t in busy)
    budget = profile.cpu_budget
    if used >= SATURATED * budget:
        budget = min(used, budget + other_load_at_start / max(local_world_size, 1))
    return replace(profile, cpu_budget=budget, worker_cpu_ms=worker_cpu_ms,
                   main_cpu_ms=main_cpu_ms)


def learn(serial: TrialResult, one_worker: TrialResult, cpu_budget: float,
          step_on_cpu: bool) -> CostProfile:
    """Fit the profile from a ``num_workers=0`` trial and a ``num_workers=1`` trial."""
    serial_ms = serial.ms_per_batch
    cycle_ms = one_worker.ms_per_batch
    worker_ms = one_worker.worker_ms or cycle_ms
    step_ms = one_worker.step_ms or 0.0
    # With one worker the consumer may be what limits the rate; then the worker's own cycle is
    # its measured work (plus hand-off), not the observed rate.
    if one_worker.consumer_idle_frac is not None and one_worker.consumer_idle_frac < 0.05:
        cycle_ms = max(worker_ms, 0.01)
    return CostProfile(
        serial_ms=serial_ms,
        cycle_ms=max(cycle_ms, worker_ms, 0.01),
        worker_ms=max(worker_ms, 0.001),
        worker_cpu_ms=min(one_worker.worker_cpu_ms or 0.0, worker_ms),
        main_cpu_ms=one_worker.main_cpu_ms or 0.0,
        main_thread_cpu_ms=one_worker.main_thread_cpu_ms,
        step_ms=step_ms,
        step_on_cpu=step_on_cpu,
        cpu_budget=max(cpu_budget, 0.5),
        batch_bytes=one_worker.batch_bytes or 0.0,
        startup_s=one_worker.startup_s,
    )
