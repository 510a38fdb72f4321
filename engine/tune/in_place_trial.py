"""One setting's measurement in a running job (tune/in_place.py): its batches' cycles and waits,
its clock (when it is judged as it stands), its rate and the rate's uncertainty, and the loop it
reads (a step and workers' making: NOTE [ The count the wait predicts ], NOTE [ The time an
in-place search says ] in tune/in_place_time.py).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dataloader_tuner.analyse.metrics import block_rate_interval
from dataloader_tuner.config import TunedSettings
from dataloader_tuner.tune.trial_rules import MIN_STEADY_BATCHES, TARGET_CI

# NOTE [ The count the wait predicts ]: a loop waiting less than this share of its time is fed
FED_WAIT_SHARE = 0.05

Clock = Callable[[], float]  # seconds, monotonic: time.monotonic, or a test's simulated time

# A trial that cannot reach its rate's target is judged as it stands after MIN_TRIAL_S, or
# longer when batches are slow (room for its warm-up and 1.5x the steady batches a rate needs),
# up to MAX_TRIAL_S: the offline tuner's clock (child/tuning.py).
MIN_TRIAL_S = 4.0
MAX_TRIAL_S = 30.0
ROOM_STEADY_SHARE = 1.5
LONGER = 2.0  # a close call's trial runs on to this many times its cap: sqrt(2) narrower


def trial_cap_s(per_batch_s: float, warmup: int, steady_batches: int) -> float:
    """When a trial is judged as it stands, its batches taking ``per_batch_s`` each."""
    room = warmup + ROOM_STEADY_SHARE * steady_batches
    return min(max(MIN_TRIAL_S, per_batch_s * room), MAX_TRIAL_S)


@dataclass(frozen=True)
class LoopModel:
    """A measured trial read as the loop's step and its workers' making (NOTE [ The time an
    in-place search says ], tune/in_place_time.py)."""

    step_s: float  # the loop's own work a batch
    make_s: float  # one worker's (or, without workers, the loop's) seconds to make a batch
    cpus: float | None  # the cores workers make batches on (None: no cap)

    @classmethod
    def read(cls, workers: int, cycle_s: float, wait_s: float, cpus: float | None
             ) -> LoopModel:
        step = max(cycle_s - wait_s, 0.0)
        return cls(step, workers * cycle_s if workers else wait_s, cpus)

    def cycle_s(self, workers: int) -> float:
        if workers == 0:
            return self.make_s + self.step_s
        making = min(workers, math.ceil(self.cpus)) if self.cpus else workers
        return max(self.step_s, self.make_s / making)

    def fed_by(self) -> int:
        """The workers that feed the step, up to the cores (as Trial.fed_by)."""
        need = math.ceil(self.make_s / max(self.step_s, 1e-9))
        return max(1, min(need, math.ceil(self.cpus)) if self.cpus else need)



@dataclass
class Trial:
    """One setting's measurement: the loop's time and samples per steady batch."""

    setting: TunedSettings
    clock: Clock = field(default=time.monotonic, repr=False, compare=False)
    started: float = field(init=False)  # when its clock started (from the clock)
    seen: int = 0  # batches since its loader started (a switch, an epoch), warm-up included
    taken: int = 0  # all its batches, warm-ups included
    cycles: list[float] = field(default_factory=list)  # wait + step, per steady batch
    samples: list[int] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)  # the wait of each, where told
    # Start-up, charged as the job pays it: an epoch of this many batches restarts the workers
    # (None: the job's loader keeps them, persistent_workers=True, or its length is unknown).
    epoch_batches: int | None = None
    firsts: list[float] = field(default_factory=list)  # the first cycle after each loader start
    fresh: bool = False  # its loader just started: the next batch is that first
    # Measured on to LONGER times its cap (or TARGET_CI): its gain over the best was within
    # the noise.
    longer: bool = False
    capped: bool = False  # judged as it stands at its time cap, its rate short of TARGET_CI

    def __post_init__(self) -> None:
        self.started = self.clock()

    @property
    def samples_per_s(self) -> float | None:
        total = sum(self.cycles) + self.startup_charge_s()
        return sum(self.samples) / total if total > 0 else None

    def startup_s(self) -> float | None:
        """What starting its loader cost beyond a steady batch: the first batch's cycle (its
        wait dates from the switch or the epoch's start) less the median steady one."""
        if not self.firsts or not self.cycles:
            return None
        return max(statistics.median(self.firsts) - statistics.median(self.cycles), 0.0)

    def startup_charge_s(self) -> float:
        """The start-up the measured batches would pay in the job: one per epoch_batches."""
        startup = self.startup_s()
        if not self.epoch_batches or startup is None:
            return 0.0
        return startup * len(self.cycles) / self.epoch_batches

    def fed_by(self, cpus: float | None) -> int | None:
        """The workers that would feed the loop's step (NOTE [ The count the wait predicts ]),
        at most one a core (``cpus``, None: no cap); None without workers or waits told."""
        n, model = self.setting.num_workers, self.model(cpus)
        if n < 1 or model is None:
            return None
        cycle = statistics.median(self.cycles)
        if cycle - model.step_s < FED_WAIT_SHARE * cycle:  # it hardly waits
            return n
        return max(n, model.fed_by())

    def model(self, cpus: float | None) -> LoopModel | None:
        """Its loop read as a step and workers' making (NOTE [ The time an in-place search
        says ]); None where its waits were not told."""
        if len(self.waits) < len(self.cycles) or not self.cycles:
            return None
        return LoopModel.read(self.setting.num_workers, statistics.median(self.cycles),
                              statistics.median(self.waits), cpus)

    def interval(self) -> float | None:
        """95% half-width of the rate, as a fraction (batch means, as metrics.rate_interval)."""
        return block_rate_interval(self.samples, self.cycles, max(self.setting.num_workers, 1))

    def done(self) -> bool:
        elapsed = self.clock() - self.started
        per_batch = elapsed / max(self.taken, 1)
        cap = trial_cap_s(per_batch, self.setting.warmup_batches, MIN_STEADY_BATCHES)
        cap *= LONGER if self.longer else 1
        if elapsed > cap:
            self.capped = len(self.cycles) >= 3 * max(self.setting.num_workers, 1)
            return self.capped
        if len(self.cycles) < MIN_STEADY_BATCHES:
            return False
        if len(self.cycles) % 5:  # the interval is O(n): every 5th batch is often enough
            return False
        ci = self.interval()
        return ci is not None and ci <= TARGET_CI

    def batches_to_know(self) -> float:
        """The steady batches its rate needed to be known to TARGET_CI: as many as it took,
        or, judged at its cap short of that, as many as the interval's 1/sqrt(n) asks."""
        ci = self.interval()
        if not self.capped or ci is None:
            return float(len(self.cycles))
        return len(self.cycles) * (ci / TARGET_CI) ** 2

    def to_dict(self) -> dict[str, Any]:
        rate, ci = self.samples_per_s, self.interval()
        startup = self.startup_s()
        return {**self.setting.workers_and_prefetch(), "samples_per_s": rate,
                "batches": len(self.cycles),
                "startup_ms": 1000 * startup if startup is not None else None,
                "startup_charged": bool(self.epoch_batches) and startup is not None,
                "rate_ci": ci, "conclusive": len(self.cycles) >= MIN_STEADY_BATCHES
                and ci is not None, "step_and_wait_ms": 1000 * sum(self.cycles)
                / len(self.cycles) if self.cycles else None}
