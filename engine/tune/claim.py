"""The speedup a tune claims, from the pick and the user's settings measured alternately at the
end of the tune, each charged its start-up as the job would pay it.

NOTE [ Claims from the end of the tune ]

    A search measures settings one after another while the data source may be warming: a page
    cache filling, an LMDB or a remote store getting faster as it is read. A baseline measured
    first (cold) against a pick measured last (warm) claims the warming as a speedup: on
    datasets written by others an LMDB-backed image set claimed 1.93x for 6 workers where a
    plain loop measured 0.97x, and an audio pipeline 1.25x where 0.99x was measured. So the
    claim comes only from trials made at the end, the user's settings and the pick in turn
    (A B, then B A: a drift that is linear in time weighs both sides alike), and a setting the
    search measured early that measures differently at the end is said to have drifted.

    Start-up: a setting whose workers restart every epoch (workers, persistent_workers=False)
    pays their start-up once an epoch. A trial that crossed an epoch paid it in its window; one
    that did not is charged it once per epoch of the dataset's length, as the job would.

NOTE [ Pairs that cannot narrow a claim ]

    A claim known more loosely than CLAIM_WITHIN_PCT after CLAIM_PAIRS pairs gets more pairs,
    up to MAX_CLAIM_PAIRS, only where they could narrow it under that: its width is the wider
    of the sides' intervals (narrowing with the square root of the trials) and the spread of
    the pairs' ratios (half their range, which more pairs can only widen). ImageNet-style JPEGs
    at batch 256 (1.3 s a batch, trials of +-13-21%) measured four pairs, 8 trials and 265 s of
    a 472 s tune, to end at +-12% and no claim, which its first two pairs already foretold.

NOTE [ A side that slowed while tuning ]

    The end's pairs see the machine of the last minute only. On a shared 2-core machine a fast
    loader's rate moves by a third between minutes (noisy_worker at 0 workers: 131k samples/s
    early in a tune, 87k in all four of its end trials; plain loops of it in fresh processes
    88k-145k), and pairs taken in one slow minute agree with each other: a tune claimed 12.78x
    +-3% where plain loops measured 19.2x. A setting measured slower at the end than early in
    the tune (beyond the noise, as ``drift_warning`` says) by more than the other side slowed makes
    the claim's interval that wide, and one wider than CLAIM_WITHIN_PCT is not made. Only a
    slowdown: a data source warming up (the case above) makes the end faster, and its end is the
    steady state; both sides slowing alike is a slow minute the ratio survives.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.recommend import spread_of, uncertainty_pct, within_pct
from dataloader_tuner.tune.same_settings import setting
from dataloader_tuner.tune.trial_rules import MIN_STEADY_BATCHES

CLAIM_PAIRS = 2  # (A B), (B A): four trials at the end of a tune...
MAX_CLAIM_PAIRS = 4  # ...and more pairs, up to this, while the claim is wider than...
CLAIM_WITHIN_PCT = 10.0  # ...this: a wider one is not claimed, the figures shown side by side
# Trials made after the search (or before it): not the search's early figures of a setting.
OUTSIDE_SEARCH = ("prewarm", "baseline", "final", "cached", "in_order", "out_of_order",
                  "threads_default", "threads_one", "heap_fresh")
DRIFT_MIN = 0.15  # an early and a late rate of one setting this far apart (or beyond noise)


def alternate(measure_base: Callable[[int], TrialResult | None],
              measure_pick: Callable[[int], TrialResult | None],
              pairs: int = CLAIM_PAIRS, first: int = 0
              ) -> tuple[list[TrialResult | None], list[TrialResult | None]]:
    """Each side measured ``pairs`` times, in turn: base then pick, then pick then base, ...
    ``measure_*(repeat)`` runs one trial; ``first``: the pairs already measured (their order
    goes on)."""
    base: list[TrialResult | None] = []
    pick: list[TrialResult | None] = []
    for repeat in range(first, first + pairs):
        order = ((base, measure_base), (pick, measure_pick))
        for results, measure in (order if repeat % 2 == 0 else order[::-1]):
            results.append(measure(repeat))
    return base, pick


@dataclass(frozen=True)
class InTurn:
    """Two settings measured in turn (``alternate``): their mean rates and how well their ratio
    is known (both sides' uncertainties combined, as a fraction)."""

    a: list[TrialResult]
    b: list[TrialResult]
    rate_a: float
    rate_b: float
    noise: float | None

    def b_pays(self, min_gain: float) -> bool:
        """B faster than A by ``min_gain`` and beyond the noise, every trial one to believe."""
        gain = self.rate_b / self.rate_a
        return (self.noise is not None and all(t.conclusive for t in self.a + self.b)
                and gain >= min_gain and gain - 1 > self.noise)

    def noise_text(self) -> str:
        return f", ±{self.noise:.0%}" if self.noise is not None else ""


def in_turn(a: list[TrialResult | None], b: list[TrialResult | None]) -> InTurn | None:
    """The two sides of ``alternate``, or None where a trial reached no steady state."""
    kept_a = [t for t in a if t is not None]
    kept_b = [t for t in b if t is not None]
    if len(kept_a) < len(a) or len(kept_b) < len(b) or not kept_a or not kept_b:
        return None
    pcts = [p for p in (uncertainty_pct(kept_a), uncertainty_pct(kept_b)) if p is not None]
    return InTurn(kept_a, kept_b, statistics.fmean(t.samples_per_s for t in kept_a),
                  statistics.fmean(t.samples_per_s for t in kept_b),
                  (sum(p ** 2 for p in pcts) ** 0.5) / 100 if pcts else None)


def items_per_s(trial: TrialResult) -> float:
    """The rate in the dataset's own items: samples, or whole batches with batch_size=None."""
    if trial.batch_size is None and trial.batches_per_s:
        return trial.batches_per_s
    return trial.samples_per_s


def paid_restart(trial: TrialResult) -> bool:
    """Its workers restarted inside its steady window: its rate includes their start-up."""
    return bool(trial.num_workers and not trial.persistent_workers and trial.restarts_measured)


def startup_charge_s(trial: TrialResult) -> float:
    """What one epoch's start of this setting costs beyond a steady batch, in seconds; 0 when
    its workers are kept (or there are none) or its window already paid it."""
    if trial.num_workers == 0 or trial.persistent_workers or trial.restarts_measured:
        return 0.0
    return max(trial.startup_s - trial.ms_per_batch / 1000.0, 0.0)


def charged_rate(trial: TrialResult, epoch_items: int | None) -> float:
    """samples/s with the setting's start-up paid once per epoch of ``epoch_items``."""
    charge = startup_charge_s(trial)
    if not charge or not epoch_items:
        return trial.samples_per_s
    epoch_s = epoch_items / items_per_s(trial)
    return trial.samples_per_s * epoch_s / (epoch_s + charge)


@dataclass(frozen=True)
class Side:
    """One setting as the end of the tune measured it."""

    trials: list[TrialResult]
    rate: float  # mean of the trials, start-up charged
    measured_rate: float  # mean of the trials as measured
    uncertainty_pct: float | None
    startup_s: float  # the start-up charged per epoch, the trials' mean (0: none)


def side(trials: list[TrialResult], epoch_items: int | None) -> Side:
    return Side(trials, statistics.fmean(charged_rate(t, epoch_items) for t in trials),
                statistics.fmean(t.samples_per_s for t in trials), uncertainty_pct(trials),
                statistics.fmean(startup_charge_s(t) for t in trials))


@dataclass(frozen=True)
class Claim:
    speedup: float | None  # claimed: None where too short, too uncertain or not measured
    speedup_pct: float | None
    note: str | None  # why no speedup is claimed
    base: Side | None
    pick: Side | None
    ratio: float | None = None  # the pick's rate over the baseline's as measured, claimed or not

    @property
    def too_wide(self) -> bool:
        """Measured, but known too loosely to claim (more pairs may narrow it)."""
        return (self.ratio is not None and self.speedup_pct is not None
                and self.speedup_pct > CLAIM_WITHIN_PCT)

    @property
    def slower(self) -> bool:
        """The pick measured slower than the baseline, beyond the measurement's noise."""
        return self.ratio is not None and self.ratio * (1 + (self.speedup_pct or 0) / 100) < 1

    def kept(self) -> "Claim":
        """The claim once the baseline is kept as the recommendation: no speedup."""
        return Claim(1.0, self.speedup_pct, "the recommendation is the settings you already "
                     "have: they measured faster than the search's pick at the end of the tune",
                     self.base, self.pick, self.ratio)

    def to_dict(self) -> dict[str, float | str | None]:
        return {"speedup": self.speedup, "speedup_pct": self.speedup_pct,
                "speedup_note": self.note,
                "claimed_from": (f"{len(self.pick.trials)} trials of the pick alternating with "
                                 f"{len(self.base.trials)} of the baseline at the end of the tune"
                                 f"{processes_text(self.base, self.pick)}"
                                 if self.pick and self.base else None)}


def processes_text(base: Side, pick: Side) -> str:
    """Which processes measured the pairs (NOTE [ A claim from two processes ],
    child/claiming.py), and each one's figures where both did."""
    second = [t for t in base.trials + pick.trials if t.second_process]
    if not second:
        return ", all in the tune's process"
    rates = []
    for elsewhere in (False, True):
        sides = [statistics.fmean(t.samples_per_s for t in s.trials
                                  if t.second_process == elsewhere) for s in (pick, base)
                 if any(t.second_process == elsewhere for t in s.trials)]
        if len(sides) < 2:
            return f", {len(second)} of them in a second, fresh process"
        rates.append(f"{sides[0]:.0f} against {sides[1]:.0f} ({sides[0] / sides[1]:.2f}x)")
    return (f", in two processes: the pick {rates[0]} in the tune's, {rates[1]} in a "
            "second, fresh one")


def end_claim(base: list[TrialResult | None], pick: list[TrialResult | None],
              epoch_items: int | None) -> Claim:
    """The speedup of the pick over the baseline from the end's alternating trials, with its
    95% uncertainty, or why none is claimed (not measured, a trial without a steady state, too
    short, or known more loosely than CLAIM_WITHIN_PCT)."""
    if not base or not pick:
        return Claim(None, None, "no speedup is claimed: your time limit left no room to "
                     "measure the pick and your settings in turn", None, None)
    if any(t is None for t in base + pick):
        return Claim(None, None, "no speedup is claimed: a trial at the end of the tune reached "
                     "no steady state", None, None)
    base_side = side([t for t in base if t is not None], epoch_items)
    pick_side = side([t for t in pick if t is not None], epoch_items)
    short = [name for name, s in (("the pick", pick_side), ("the baseline", base_side))
             if not all(t.conclusive for t in s.trials)]
    if short:
        return Claim(None, None, f"no speedup is claimed: the trials of {' and '.join(short)} "
                     f"were too short to believe (fewer than {MIN_STEADY_BATCHES} steady "
                     "batches); tune with a longer --budget-s, or make batches cheaper", base_side, pick_side)
    pct = ratio_uncertainty_pct(base_side, pick_side, epoch_items)
    ratio = pick_side.rate / base_side.rate
    if pct is not None and pct > CLAIM_WITHIN_PCT:
        return Claim(None, pct, f"no speedup is claimed: the pick measured {pick_side.rate:.0f} "
                     f"samples/s against {base_side.rate:.0f} ({ratio:.2f}x) over "
                     f"{len(pick_side.trials)} trials each in turn"
                     f"{processes_text(base_side, pick_side)}, but that ratio is known only "
                     f"to ±{pct:.0f}%, too loosely to act on (the machine's load, the data's "
                     "speed or the process varied); verify it with Apply", base_side, pick_side,
                     ratio)
    return Claim(ratio, pct, None, base_side, pick_side, ratio)


def one_process(result: Claim, why: str) -> Claim:
    """The claim where no pair was measured in a second process (NOTE [ A claim from two
    processes ], child/claiming.py): the spread between processes unknown, none is made."""
    if result.speedup is None or result.base is None or result.pick is None:
        return result
    return Claim(None, result.speedup_pct, f"no speedup is claimed: the pick measured "
                 f"{result.pick.rate:.0f} samples/s against {result.base.rate:.0f} "
                 f"({result.ratio:.2f}x) in the tune's process only ({why}), and a plain loop "
                 "runs in a process of its own: a claim needs a pair from a second process to "
                 "know how far processes differ; verify it with Apply", result.base,
                 result.pick, result.ratio)


def can_narrow(base: list[TrialResult], pick: list[TrialResult], epoch_items: int | None,
               pairs: int = MAX_CLAIM_PAIRS) -> bool:
    """Whether ``pairs`` pairs could make a claim the pairs so far know too loosely (NOTE [
    Pairs that cannot narrow a claim ]): the sides' intervals narrow with the square root of
    their trials; the spread of the pairs' ratios (half their range) can only widen."""
    within, spread = ratio_parts(base, pick, epoch_items)
    if spread is not None and spread > CLAIM_WITHIN_PCT:
        return False
    return (within or 0.0) * math.sqrt(len(pick) / pairs) <= CLAIM_WITHIN_PCT


def ratio_parts(base: list[TrialResult], pick: list[TrialResult], epoch_items: int | None
                ) -> tuple[float | None, float | None]:
    """The two parts of the ratio's uncertainty, in %: both sides' trial intervals combined,
    and the spread of the per-pair ratios (None where unknown)."""
    withins = [p for p in (within_pct(base), within_pct(pick)) if p is not None]
    within = sum(p ** 2 for p in withins) ** 0.5 if withins else None
    ratios = [charged_rate(p, epoch_items) / charged_rate(b, epoch_items)
              for b, p in zip(base, pick)]
    return within, spread_of(ratios)


def ratio_uncertainty_pct(base: Side, pick: Side, epoch_items: int | None) -> float | None:
    """How well the pick's rate over the baseline's is known, in %: both sides' trial intervals
    combined, or the spread of the per-pair ratios, whichever is wider. Each pair was measured
    back to back, so a slow minute of the machine's slows both of its sides: the pairs' ratios
    hold where the sides' own rates drifted (audio with a CPU step: its 0-worker trials ranged
    141-177 samples/s, +-12% each side and +-13% combined, while its four pairs' ratios held
    within +-9%)."""
    known = [u for u in ratio_parts(base.trials, pick.trials, epoch_items) if u is not None]
    if not known:  # one trial each, without intervals: the sides' own figures
        sides = [p for p in (pick.uncertainty_pct, base.uncertainty_pct) if p is not None]
        return sum(p ** 2 for p in sides) ** 0.5 if sides else None
    return max(known)


@dataclass(frozen=True)
class Drift:
    """One setting's rate early in the tune and at its end, apart beyond their noise."""

    before: float
    after: float
    allowed: float  # the change their noise (and DRIFT_MIN) allowed, as a fraction

    @property
    def change(self) -> float:
        return self.after / self.before - 1.0


def drifted(early: list[TrialResult], late: Side) -> Drift | None:
    """``late``'s rate against the same setting's ``early`` trials, where they disagree beyond
    their noise and by DRIFT_MIN at least."""
    # A late window that paid a restart the search's never did is slower by start-up, not
    # drift; one of a second process differs by its process (NOTE [ A claim from two
    # processes ], child/claiming.py), not by the minute.
    late_trials = [t for t in late.trials if not paid_restart(t) and not t.second_process]
    if not early or not late_trials:
        return None
    before = statistics.median(t.samples_per_s for t in early)
    after = statistics.fmean(t.samples_per_s for t in late_trials)
    noise = [p / 100.0 for p in (uncertainty_pct(early), uncertainty_pct(late_trials))
             if p is not None]
    found = Drift(before, after, max(DRIFT_MIN, 2 * sum(n ** 2 for n in noise) ** 0.5))
    return found if abs(found.change) > found.allowed else None


def slowed(claim: Claim, pick: Drift | None, base: Drift | None) -> Claim:
    """The claim where a side measured slower at the end than early in the tune (NOTE [ A
    side that slowed while tuning ]): no claim where one slowed more than the other by more
    than CLAIM_WITHIN_PCT (both slowing alike: the machine's slow minute, the ratio holds)."""
    def slowdown(found: Drift | None) -> float:
        return max(-found.change, 0.0) if found is not None else 0.0

    apart = abs(slowdown(pick) - slowdown(base))
    if claim.speedup is None or claim.base is None or claim.pick is None \
            or 100.0 * apart <= CLAIM_WITHIN_PCT:
        return claim
    pct = max(claim.speedup_pct or 0.0, 100.0 * apart)
    who = "the pick" if slowdown(pick) > slowdown(base) else "your settings"
    return Claim(None, pct, f"no speedup is claimed: the pick measured {claim.pick.rate:.0f} "
                 f"samples/s against {claim.base.rate:.0f} ({claim.ratio:.2f}x) at the end of the "
                 f"tune, but {who} measured {max(slowdown(pick), slowdown(base)):.0%} slower "
                 "there than earlier in the tune (the machine's load changed while tuning), so "
                 f"the ratio is known only to ±{pct:.0f}%, too loosely to act on; verify it with "
                 "Apply", claim.base, claim.pick, claim.ratio)


def drift_warning(found: Drift, who: str) -> Diagnostic:
    """A warning for ``who``'s drift (``drifted``): the data source or the machine changed
    while tuning."""
    before, after, allowed, change = found.before, found.after, found.allowed, found.change
    way = "faster" if change > 0 else "slower"
    return Diagnostic(
        "drifted_while_tuning", "warning",
        f"{who} measured {before:.0f} samples/s early in the tune and {after:.0f} at its end "
        f"({abs(change):.0%} {way}, beyond the noise of ±{allowed:.0%}): the data source "
        "(a page cache or a store warming up) or the machine's load changed while tuning. "
        "The speedup claimed comes from the end's alternating trials only; verify it before "
        "switching.",
        {"setting": who, "early_samples_per_s": before, "late_samples_per_s": after,
         "allowed_frac": allowed})


def comparable(early: list[TrialResult], config: LoaderConfig) -> list[TrialResult]:
    """The search's trials of ``config``'s setting whose rate paid no restart the end's might
    not (the search keeps workers; a window without an epoch start paid none)."""
    wanted = setting(config.num_workers, config.prefetch_factor, config.pin_memory)
    return [t for t in early if t.phase not in OUTSIDE_SEARCH
            and setting(t.num_workers, t.prefetch_factor, t.pin_memory) == wanted
            and t.in_order == config.in_order and not paid_restart(t)
            and (t.worker_threads == 1) == (config.worker_threads == 1)
            and t.keep_freed_memory == config.keep_freed_memory]


def end_reason(result: Claim, source: str) -> str:
    """The reason line that says where the claim comes from, and any start-up it charged."""
    assert result.pick is not None and result.base is not None
    text = (f"Measured at the end of the tune, in turn with {source} "
            f"({len(result.pick.trials)} trials each"
            f"{processes_text(result.base, result.pick)}): {result.pick.rate:.0f} samples/s "
            f"against {result.base.rate:.0f}")
    charged = [f"{who} {s.startup_s:.2f} s of worker start-up per epoch "
               f"({s.measured_rate:.0f} samples/s as measured)"
               for who, s in (("the pick", result.pick), ("your settings", result.base))
               if s.startup_s > 0]
    if charged:
        text += f", charging {' and '.join(charged)} (workers restarted every epoch)"
    return text + "."


def keep_reason(result: Claim, source: str) -> str:
    """Why the user's settings are kept over the search's pick."""
    assert result.pick is not None and result.base is not None and result.ratio is not None
    return (f"Keep {source}: at the end of the tune they measured {result.base.rate:.0f} "
            f"samples/s against {result.pick.rate:.0f} for the search's pick "
            f"({1 - result.ratio:.0%} slower, ±{result.speedup_pct or 0:.0f}%), measured in "
            "turn. The search's own figures below were taken earlier, as the data source or "
            "the machine may have been slower.")
