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
from typing import Any, Protocol

from dataloader_tuner.config import TunedSettings
from dataloader_tuner.record.trials import InPlaceDecision
from dataloader_tuner.tune.in_place_time import (SearchTime, accounting, announcement,
                                                  counts_left, median_or, seconds_left)
from dataloader_tuner.tune.in_place_trial import Clock, LoopModel, Trial
from dataloader_tuner.tune.recommend import FEWER_WORKERS_TOLERANCE
from dataloader_tuner.tune.tuner import MORE_WORKERS_GAIN, grow, shrink

# The job's first seconds run slower (page faults, allocator growth, lazy imports, caches): not
# measured, or the starting setting would look worse than it is.
PREWARM_S = 2.0


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
        # NOTE [ The time an in-place search says ] (tune/in_place_time.py)
        self.time = SearchTime()

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
        if self.time.measuring_from is None:
            self.time.measuring_from = now + PREWARM_S
        trial = self.trial
        first, trial.fresh = trial.fresh, False
        if now < self.time.measuring_from:  # the job's first batches: one-off costs
            trial.started = now
            return None
        self.time.begin(now)
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
        now = self.clock()
        self.measured.append(trial)
        predicted = self.predicted
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
        verdict += self._predict(trial)
        if self.time.announced_s is None or self.predicted != predicted:
            verdict += self._announce(now)
        self.decisions.append(log_line(trial.setting, trial.samples_per_s, trial.interval(),
                                       verdict))
        following = self._next_setting()
        if following is None:
            self.finished = True
            chosen = self._best()
            self.time.took_s = self.time.elapsed(now)
            took = accounting(self.time)
            self.decisions.append(log_line(chosen.setting, chosen.samples_per_s,
                                           chosen.interval(),
                                           f"chosen: {_name(chosen.setting)}{took}"))
            return chosen.setting if chosen.setting != running else None
        self.trial = self._trial(following)
        return following

    def _announce(self, now: float) -> str:
        """The time left, said (NOTE [ The time an in-place search says ])."""
        tried = tried_or_failed(self)
        model = self._model()
        counts = counts_left([s.num_workers for s in self.queue if s not in tried],
                             self.predicted is not None, self._setting(0) in tried, model)
        startups = [t.startup_s() for t in self.measured if t.setting.num_workers]
        left = seconds_left(counts, model, self._batches_to_know,
                            median_or([s for s in startups if s is not None], 0.0),
                            self.baseline.prefetch_factor or 2)
        elapsed = self.time.elapsed(now)
        self.time.said(elapsed + left)
        return announcement(elapsed, left, round(sum(odds for _, odds in counts)))

    def _batches_to_know(self, workers: int) -> float | None:
        """The steady batches a trial of ``workers`` needs, as those measured alike needed
        (with workers or without: NOTE [ The time an in-place search says ]); None: unknown."""
        alike = [t.batches_to_know() for t in self.measured
                 if bool(t.setting.num_workers) == bool(workers)]
        return statistics.median(alike) if alike else None

    def _model(self) -> LoopModel:
        """The loop as the first trial with workers reads it, else as the first trial; where
        no wait was told, all of each cycle is making."""
        models = [(t.setting.num_workers, t.model(self.cpus)) for t in self.measured]
        told = [(n, m) for n, m in models if m is not None]
        if told:
            return next((m for n, m in told if n), told[0][1])
        first = self.measured[0]
        cycle = statistics.median(first.cycles)
        return LoopModel(0.0, cycle * max(first.setting.num_workers, 1), self.cpus)

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
        """More workers that gain at least MORE_WORKERS_GAIN, but less than the two rates are
        known to, are measured on before they are judged: kept on noise, a climb stops
        wherever the noise led it (3 and 4 workers on 2 cores kept at "10% faster, ±12%" and
        "17% faster, ±18%"; plain epochs of 4 then 0.87 of the best). The looser of the two
        is measured on, each once. (A gain under MORE_WORKERS_GAIN is not measured on: with
        two rates known to ±4%, every step that does not pay would be.)"""
        best = self.best
        if self.challenger is not None or best is None or best is trial:
            return False
        if self.predicted is None:  # its prediction is measured next, whatever it reads
            return False
        if trial.setting.num_workers <= best.setting.num_workers:
            return False
        if not best.samples_per_s or not trial.samples_per_s:
            return False
        gain = trial.samples_per_s / best.samples_per_s - 1
        known_to = _gain_interval(trial, best)
        if not MORE_WORKERS_GAIN <= gain < known_to:
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
                "announced_s": self.time.announced_s, "estimated_s": self.time.estimated_s,
                "took_s": self.time.took_s,
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
