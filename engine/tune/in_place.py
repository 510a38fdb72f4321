"""Tune in place: try worker counts inside the running job, judged by the training loop itself.

The objective is the loop's own rate: samples per second of "wait for a batch + the real step",
so a count that makes batches faster than the model can use them gains nothing and is not
taken; where the job's workers restart each epoch, each setting's start-up is charged once per
epoch too (Trial.startup_charge_s). The search measures the job's own setting (and 1 worker
where the job has none), then the count the loop's own wait predicts and its neighbours (NOTE [
The count the wait predicts ]), then climbs from the best with the offline tuner's rules
(tune/tuner.py): a count above the best is kept where it gains at least MORE_WORKERS_GAIN and
more than the two rates are known to, a count below where it loses less than
FEWER_WORKERS_TOLERANCE of the fastest (fewer workers: less CPU and memory for the same rate);
up while counts above pay, else down while fewer lose nothing. Each setting is
measured until its rate is known to TARGET_CI (at least MIN_STEADY_BATCHES steady batches), or
MAX_TRIAL_S; a worse setting is left at once (rolled back to the best so far), and a setting
that fails is dropped for good with the job's own settings back in place.

``InPlaceSearch`` is pure: it is fed one (samples, seconds) per batch and answers which setting
to run next, so tests drive it without loaders. The swapping of loaders between batches, which
keeps every epoch's samples and order as the sampler drew them, is in loader.py.

NOTE [ The count the wait predicts ]

    A climb that steps one count at a time stops at the first step that does not pay, and
    from 0 workers that step is 1 worker, which on a loader whose batches take long to make is
    no faster than none: the one worker makes batches as slowly as the loop did, and only the
    step overlaps. pytorch/examples' ImageNet loop (32 JPEGs a batch, a job of 0 workers) read
    0 workers 222.7 samples/s and 1 worker 215.1, and the search stopped at 0, where plain
    epochs took 2.76-4.01 s at 0 workers and 2.27-2.30 s at 2. So the first trial with workers
    (n of them, the loop's cycle c a batch, of which it waited w) is read as a model: the
    workers hand a batch every c, so each makes one every n * c, and the step (c - w) is fed
    by n * c / (c - w) workers, at most one per core where the loader's work is the CPU's (a
    loop that waits on storage climbs past that from there). Where the loop hardly waits
    (w < FED_WAIT_SHARE of c) n already feeds it. That count and its neighbours are measured
    whatever 1 worker measured against 0.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from dataloader_tuner.analyse.metrics import block_rate_interval
from dataloader_tuner.config import TunedSettings
from dataloader_tuner.record.trials import InPlaceDecision
from dataloader_tuner.tune.recommend import FEWER_WORKERS_TOLERANCE
from dataloader_tuner.tune.trials import MIN_STEADY_BATCHES, TARGET_CI
from dataloader_tuner.tune.tuner import MORE_WORKERS_GAIN, grow, shrink

# A trial that cannot reach TARGET_CI is judged as it stands after MIN_TRIAL_S, or longer when
# batches are slow (room for its warm-up and 1.5x MIN_STEADY_BATCHES), up to MAX_TRIAL_S: the
# offline tuner's clock (child/tuning.py).
MIN_TRIAL_S = 4.0
MAX_TRIAL_S = 30.0
# The job's first seconds run slower (page faults, allocator growth, lazy imports, caches): not
# measured, or the starting setting would look worse than it is.
PREWARM_S = 2.0
# NOTE [ The count the wait predicts ]: a loop waiting less than this share of its time is fed
FED_WAIT_SHARE = 0.05

Clock = Callable[[], float]  # seconds, monotonic: time.monotonic, or a test's simulated time


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
    # Measured on to MAX_TRIAL_S (or TARGET_CI): its gain over the best was within the noise.
    longer: bool = False

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
        n = self.setting.num_workers
        if n < 1 or len(self.waits) < len(self.cycles) or not self.cycles:
            return None
        cycle, wait = statistics.median(self.cycles), statistics.median(self.waits)
        if wait < FED_WAIT_SHARE * cycle:
            return n
        step = max(cycle - wait, 1e-9)
        need = math.ceil(n * cycle / step)
        return need if cpus is None else max(n, min(need, math.ceil(cpus)))

    def interval(self) -> float | None:
        """95% half-width of the rate, as a fraction (batch means, as metrics.rate_interval)."""
        return block_rate_interval(self.samples, self.cycles, max(self.setting.num_workers, 1))

    def done(self) -> bool:
        elapsed = self.clock() - self.started
        per_batch = elapsed / max(self.taken, 1)
        room = self.setting.warmup_batches + 1.5 * MIN_STEADY_BATCHES
        cap = MAX_TRIAL_S if self.longer else min(max(MIN_TRIAL_S, per_batch * room), MAX_TRIAL_S)
        if elapsed > cap:
            return len(self.cycles) >= 3 * max(self.setting.num_workers, 1) or not MAX_TRIAL_S
        if len(self.cycles) < MIN_STEADY_BATCHES:
            return False
        if len(self.cycles) % 5:  # the interval is O(n): every 5th batch is often enough
            return False
        ci = self.interval()
        return ci is not None and ci <= TARGET_CI

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


class Search(Protocol):
    """What the watched loader (watcher/loader.py) asks of a search: ``InPlaceSearch`` on its
    own, or a node's ``LeaderSearch`` / ``FollowerSearch`` (tune/node.py)."""

    @property
    def baseline(self) -> TunedSettings: ...
    @property
    def current(self) -> TunedSettings: ...
    @property
    def finished(self) -> bool: ...
    @property
    def best(self) -> Trial | None: ...
    @property
    def decisions(self) -> Sequence[InPlaceDecision]: ...
    @property
    def measured(self) -> Sequence[Trial]: ...

    def epoch_started(self, epoch: int) -> None: ...
    def loader_started(self) -> None: ...
    def after_batch(self, samples: int, cycle_s: float, wait_s: float | None = None
                    ) -> TunedSettings | None: ...
    def setting_failed(self, setting: TunedSettings, why: str) -> TunedSettings: ...
    def close(self) -> None: ...


class InPlaceSearch:
    def __init__(self, start: TunedSettings, max_workers: int, epoch_batches: int | None = None,
                 clock: Clock = time.monotonic, cpus: float | None = None) -> None:
        """``epoch_batches``: the job's epoch restarts its loader's workers every so many
        batches (persistent_workers=False): each setting is charged its start-up that often.
        ``clock``: what PREWARM_S and the trials' durations are read on. ``cpus``: the cores
        this loader may use (the predicted count's cap: NOTE [ The count the wait predicts ])."""
        self.baseline = start
        self.max_workers = max(max_workers, start.num_workers)
        self.epoch_batches = epoch_batches
        self.clock = clock
        self.cpus = cpus
        self.best: Trial | None = None
        self.trial = self._trial(start)
        self.predicted: int | None = None  # the count the first trial with workers predicts
        self.queue: list[TunedSettings] = []  # it and its neighbours, to measure next
        self.challenger: Trial | None = None  # waiting while the best is measured on
        self.decisions: list[InPlaceDecision] = []  # the search's log, as the run keeps it
        self.measured: list[Trial] = []
        self.failed: set[TunedSettings] = set()
        self.finished = False
        self.measuring_from: float | None = None  # PREWARM_S after the first batch

    @property
    def current(self) -> TunedSettings:
        return self.trial.setting if not self.finished else self._best().setting

    def epoch_started(self, epoch: int) -> None:
        """(A node's coordinated search times its switches by epoch and batch: tune/node.py.)"""

    def close(self) -> None:
        """(A node's coordinated search stops its store thread: tune/node.py.)"""

    def loader_started(self) -> None:
        """A new loader runs ``current`` (an epoch began): its first batches come from the
        prefetch, after the workers' start-up, and are not timed; the first is its start-up."""
        self.trial.seen = 0
        self.trial.fresh = True

    def after_batch(self, samples: int, cycle_s: float, wait_s: float | None = None
                    ) -> TunedSettings | None:
        """Feed one batch the loop took ``cycle_s`` for under ``current`` (``wait_s`` of it
        waiting for the batch, where told); returns a setting to switch to now, or None to
        go on."""
        if self.finished:
            return None
        now = self.clock()
        if self.measuring_from is None:
            self.measuring_from = now + PREWARM_S
        trial = self.trial
        first, trial.fresh = trial.fresh, False
        if now < self.measuring_from:  # the job's first batches: one-off costs
            trial.started = now
            return None
        if first:
            trial.firsts.append(cycle_s)
        trial.seen += 1
        trial.taken += 1
        if trial.seen <= trial.setting.warmup_batches:
            return None
        if not trial.cycles:  # its clock starts with its first steady batch, not the switch
            trial.started, trial.taken = now, 0
        trial.cycles.append(cycle_s)
        trial.samples.append(samples)
        if wait_s is not None:
            trial.waits.append(min(wait_s, cycle_s))
        if not trial.done():
            return None
        if self._too_close_to_tell(trial):
            return self._measure_on(trial)
        return self._decide()

    def _measure_on(self, trial: Trial) -> TunedSettings | None:
        """Too close to tell (``_too_close_to_tell``): the challenger is measured on, then
        the best where its own rate is the looser of the two; each once."""
        if not trial.longer:
            trial.longer = True
            return None
        best = self._best()
        gain = (trial.samples_per_s or 0.0) / (best.samples_per_s or 1.0) - 1
        self.decisions.append(log_line(
            trial.setting, trial.samples_per_s, trial.interval(),
            f"{gain:+.0%} against {_name(best.setting)}, within the ±"
            f"{_gain_interval(trial, best):.0%} the two are known to: {_name(best.setting)} "
            f"measured again to tell"))
        self.challenger, self.trial = trial, best
        best.longer, best.started, best.taken = True, self.clock(), 0
        return best.setting

    def setting_failed(self, setting: TunedSettings, why: str) -> TunedSettings:
        """A setting could not run (its workers failed to start, or crashed): never again; the
        job goes on with the best setting measured, or its own."""
        self.failed.add(setting)
        if self.best is not None and self.best.setting == setting:
            # The best so far failed too (a node's follower can say so while another setting
            # is being tried): the job's own, as measured if it was.
            self.best = next((t for t in self.measured if t.setting == self.baseline
                              and t.samples_per_s is not None), self._trial(self.baseline))
        self.decisions.append(log_line(setting, None, None, f"failed and dropped ({why}); "
                                       f"back to {_name(self._fallback())}"))
        if self.trial.setting == setting:
            self.finished = self.best is not None
            if not self.finished:  # the job's own settings failed: nothing to tune from
                self.best = self._trial(self.baseline)
                self.finished = True
        return self._fallback()

    def _trial(self, setting: TunedSettings) -> Trial:
        return Trial(setting, clock=self.clock, epoch_batches=self.epoch_batches)

    def _fallback(self) -> TunedSettings:
        return self.best.setting if self.best is not None else self.baseline

    def _best(self) -> Trial:
        """The best trial so far: there is one from the first decision on (and once finished)."""
        assert self.best is not None, "no setting measured yet"
        return self.best

    def _decide(self) -> TunedSettings | None:
        running, trial, best = self.trial.setting, self.trial, self.best
        if self.challenger is not None:  # the best was measured on: the challenger judged
            trial, self.challenger = self.challenger, None
        self.measured.append(trial)
        name = _name(trial.setting)
        if best is None:
            self.best = trial
            verdict = f"measured as the starting point ({name}, the job's own setting)"
        elif best.samples_per_s is None:  # the best failed and the job's own was never measured
            self.best = trial
            verdict = (f"measured as the new starting point ({name}): "
                       f"{_name(best.setting)} has no rate to compare with")
        else:
            verdict = self._judge(trial, best, best.samples_per_s)
        self.decisions.append(log_line(trial.setting, trial.samples_per_s, trial.interval(),
                                       verdict + self._predict(trial)))
        following = self._next_setting()
        if following is None:
            self.finished = True
            chosen = self._best()
            self.decisions.append(log_line(chosen.setting, chosen.samples_per_s,
                                           chosen.interval(), f"chosen: {_name(chosen.setting)}"))
            return chosen.setting if chosen.setting != running else None
        self.trial = self._trial(following)
        return following

    def _judge(self, trial: Trial, best: Trial, best_rate: float) -> str:
        """Keep ``trial`` as the best where it pays: more workers where they gain at least
        MORE_WORKERS_GAIN and more than the two rates' uncertainty, once measured on where
        the first was not (``_too_close_to_tell``), fewer where they lose less than
        FEWER_WORKERS_TOLERANCE of the fastest measured."""
        rate = trial.samples_per_s or 0.0
        if trial.setting.num_workers > best.setting.num_workers:
            gain, known_to = rate / best_rate - 1, _gain_interval(trial, best)
            if gain >= max(MORE_WORKERS_GAIN, known_to):
                self.best = trial
                return f"kept: {gain:.0%} faster than {_name(best.setting)}"
            if gain >= MORE_WORKERS_GAIN:
                return (f"rolled back to {_name(best.setting)}: {gain:.0%} faster, within the "
                        f"±{known_to:.0%} the two rates are known to")
        elif rate >= (1 - FEWER_WORKERS_TOLERANCE) * self._fastest_rate():
            self.best = trial
            share = rate / best_rate
            return (f"kept: {share:.2f}x {_name(best.setting)}'s rate with fewer workers"
                    if share >= 1 else
                    f"kept: {share:.0%} of {_name(best.setting)}'s rate with fewer workers "
                    f"(within the {FEWER_WORKERS_TOLERANCE:.0%} a rate is known to)")
        return f"rolled back to {_name(best.setting)}: {rate / best_rate:.0%} of its rate"

    def _too_close_to_tell(self, trial: Trial) -> bool:
        """More workers whose gain over the best is neither clearly at least MORE_WORKERS_GAIN
        nor clearly under it, at the two rates' uncertainty: kept on noise, a climb stops
        wherever the noise led it (3 and 4 workers on 2 cores kept at "10% faster, ±12%" and
        "17% faster, ±18%"); rolled back on it, it misses a real gain (3 workers read "9% of
        2's rate, ±13%" after 4 s, where plain epochs of 3 were 1.19x those of 2). Told
        apart where the looser of the two can still narrow: not measured on yet."""
        best = self.best
        if self.challenger is not None or best is None or best is trial:
            return False
        if trial.setting.num_workers <= best.setting.num_workers:
            return False
        if not best.samples_per_s or not trial.samples_per_s:
            return False
        gain = trial.samples_per_s / best.samples_per_s - 1
        known_to = _gain_interval(trial, best)
        if gain >= max(MORE_WORKERS_GAIN, known_to) or gain + known_to < MORE_WORKERS_GAIN:
            return False
        looser = trial if (trial.interval() or 0.0) >= (best.interval() or 0.0) else best
        return not (trial.longer and (best.longer or looser is trial))

    def _predict(self, trial: Trial) -> str:
        """Once, from the first trial with workers: the count that feeds the step and its
        neighbours queued (NOTE [ The count the wait predicts ]); what the log says of it."""
        fed = trial.fed_by(self.cpus) if self.predicted is None else None
        if fed is None:
            return ""
        self.predicted = fed = min(fed, self.max_workers)
        tried = tried_or_failed(self)
        self.queue = [self._setting(n) for n in (fed, fed + 1, fed - 1)
                      if 0 <= n <= self.max_workers and self._setting(n) not in tried]
        waited = statistics.median(trial.waits) / statistics.median(trial.cycles)
        why = f"; the loop waited {waited:.0%} of its time here"
        if fed == trial.setting.num_workers:
            return why + f", so {fed} worker(s) feed its step"
        return why + f": {fed} workers predicted to feed its step, measured next"

    def _setting(self, n: int) -> TunedSettings:
        """``n`` workers with the job's own prefetch (the search changes the count only)."""
        return TunedSettings(n, self.baseline.prefetch_factor if n else None)

    def _fastest_rate(self) -> float:
        """Fewer workers are judged against the fastest setting measured, so steps down cannot
        drift: each within the tolerance of the last, yet far below the fastest."""
        return max((t.samples_per_s or 0.0) for t in self.measured)

    def _next_setting(self) -> TunedSettings | None:
        """The predicted count and its neighbours first; then up from the best while it is
        the highest count measured (counts above it paid), else down while fewer are kept;
        0 workers last, always measured (NOTE [ The count the wait predicts ] for the first,
        below for the last)."""
        tried = tried_or_failed(self)
        self.queue = [s for s in self.queue if s not in tried]
        if self.queue:
            return self.queue.pop(0)
        n = self._best().setting.num_workers
        if all(t.setting.num_workers <= n for t in self.measured):
            up = self._setting(grow(n))
            if up.num_workers <= self.max_workers and up not in tried:
                return up
        down = self._setting(shrink(n))
        if down.num_workers >= 0 and down not in tried:
            return down
        # Loading in the loop itself has no transfer cost at all: the climb can miss it from
        # above (1 worker slower than 2, yet 0 the fastest: small in-memory samples), so it is
        # always measured, as the offline tuner's probe does.
        zero = self._setting(0)
        return zero if zero not in tried else None

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.workers_and_prefetch(), "finished": self.finished,
                "chosen": (self.best.setting.workers_and_prefetch()
                           if self.finished and self.best else None),
                "trials": [t.to_dict() for t in self.measured],
                "decisions": [d.to_dict() for d in self.decisions]}


def log_line(setting: TunedSettings, samples_per_s: float | None, rate_ci: float | None,
             verdict: str) -> InPlaceDecision:
    """A line of the search's log: what was measured with ``setting`` and what it led to."""
    return InPlaceDecision(setting.num_workers, samples_per_s, rate_ci, verdict,
                           setting.prefetch_factor)


def tried_or_failed(search: InPlaceSearch) -> set[TunedSettings]:
    return {t.setting for t in search.measured} | search.failed


def _gain_interval(trial: Trial, best: Trial) -> float:
    """95% half-width of ``trial``'s rate over ``best``'s, as a fraction: the two rates'
    intervals added in quadrature (0 where either has too few batches to tell)."""
    return math.hypot(trial.interval() or 0.0, best.interval() or 0.0)


def _name(setting: TunedSettings) -> str:
    return f"num_workers={setting.num_workers}"
