"""The decision: from measured trials to recommended DataLoader settings and plain reasons.

Pure functions over recorded measurements (no clocks, no processes), so the logic is tested
on recorded trials. Every reason quotes the numbers it rests on.

NOTE [ Picks within the noise ]

    A trial's rate is known to +-4% (trials.TARGET_CI, 95%), so two worker counts whose rates
    are that close cannot be told apart, and the fewer workers are taken
    (FEWER_WORKERS_TOLERANCE). At 2% the pick followed noise on a flat plateau: cpu_bound
    picked 4 workers in 2 of 3 tunes where 2 measured fastest head to head (4 ran at 0.94 and
    0.96 of 2's rate; bench/tune_quality.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from dataloader_tuner.tune.costmodel import CostProfile
from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.system import SystemSnapshot
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.trial_rules import TARGET_CI

# Fewer workers when within this of the fastest: NOTE [ Picks within the noise ].
FEWER_WORKERS_TOLERANCE = TARGET_CI
STILL_RISING_GAIN = 0.03  # the top count beat the one below by this much: the peak lies beyond
FED_TOLERANCE = 0.02  # consumer idle within 2 points of the best counts as fed
FED_RATE_TOLERANCE = 0.10  # ...among settings within 10% of the best throughput (trials of
# ~0.7 s vary by +-8% on a busy machine; a step slowed by workers' CPU use costs more, 30% seen)
PIN_GAIN = 0.10  # pinned copies must be 10% faster to be worth the locked RAM
PERSISTENT_SHARE = 0.01  # restart cost above 1% of an epoch makes persistent_workers pay
BURSTY_CV = 0.5


@dataclass(frozen=True)
class Limits:
    """What the machine gives this loader, and why the search stopped where it did."""

    cpus_usable: int
    other_load_cpus: float
    local_world_size: int
    cpu_budget: float
    max_workers: int  # the user's cap
    memory_max_workers: int | None  # the cap RAM and /dev/shm allow, if it binds
    gpu_available: bool
    dataset_length: int | None

    @classmethod
    def from_system(cls, system: SystemSnapshot, local_world_size: int, max_workers: int,
                    dataset_length: int | None) -> Limits:
        return cls(system.cpus_usable, system.other_load_cpus, max(local_world_size, 1),
                   system.cpu_budget(local_world_size), max_workers, None,
                   system.gpu_available, dataset_length)

    @property
    def memory_binds(self) -> bool:
        """Memory, not the user's cap, limits the worker count."""
        return self.memory_max_workers is not None and self.memory_max_workers < self.max_workers


@dataclass(frozen=True)
class Recommendation:
    kwargs: dict[str, int | bool | None]  # DataLoader keyword arguments
    expected_samples_per_s: float
    uncertainty_pct: float | None
    reasons: tuple[str, ...]
    warnings: tuple[Diagnostic, ...] = ()
    conclusive: bool = True  # a trial behind the pick was long enough to believe


def by_workers(trials: list[TrialResult]) -> dict[int, list[TrialResult]]:
    groups: dict[int, list[TrialResult]] = {}
    for trial in trials:
        groups.setdefault(trial.num_workers, []).append(trial)
    return dict(sorted(groups.items()))


def median_rate(trials: list[TrialResult]) -> float:
    return statistics.median(t.samples_per_s for t in trials)


def median_idle(trials: list[TrialResult]) -> float | None:
    idles = [t.consumer_idle_frac for t in trials if t.consumer_idle_frac is not None]
    return statistics.median(idles) if idles else None


def uncertainty_pct(trials: list[TrialResult]) -> float | None:
    """How well the setting's samples/s is known, in %: the 95% interval of its trials (each
    trial's own, narrowed by repeats) or the spread between repeats, whichever is wider."""
    within = within_pct(trials)
    between = spread_pct(trials)
    known = [u for u in (within, between) if u is not None]
    return max(known) if known else None


def within_pct(trials: list[TrialResult]) -> float | None:
    """The trials' own 95% interval, narrowed by their number, in %."""
    cis = [t.rate_ci for t in trials if t.rate_ci is not None]
    return 100.0 * statistics.median(cis) / len(cis) ** 0.5 if cis else None


def spread_pct(trials: list[TrialResult]) -> float | None:
    """Half the range of repeated measurements, as % of their median: the answer's own noise."""
    return spread_of([t.samples_per_s for t in trials])


def spread_of(values: list[float]) -> float | None:
    """Half the range of repeated values, as % of their median (None for fewer than two)."""
    if len(values) < 2:
        return None
    return 50.0 * (max(values) - min(values)) / statistics.median(values)


def pick_fastest(groups: dict[int, list[TrialResult]], limits: Limits | None = None
                 ) -> tuple[int, str]:
    """The fewest workers within ``FEWER_WORKERS_TOLERANCE`` of the fastest measured setting.
    ``limits`` say which cap stopped the search when the pick sits at the top."""
    rates = {n: median_rate(ts) for n, ts in groups.items()}
    best_n = max(rates, key=lambda n: rates[n])
    pick = min(n for n, r in rates.items() if r >= (1 - FEWER_WORKERS_TOLERANCE) * rates[best_n])
    if pick == best_n:
        more = [n for n in rates if n > pick]
        if more:
            nxt = min(more)
            why = (f"{pick} workers gave {rates[pick]:.0f} samples/s; {nxt} gave "
                   f"{rates[nxt]:.0f} samples/s, so more workers stopped paying there.")
        else:
            why = f"{pick} workers gave the best throughput measured, {rates[pick]:.0f} samples/s."
            fewer = [n for n in rates if n < pick]
            if fewer and rates[max(fewer)] < (1 - STILL_RISING_GAIN) * rates[pick]:
                # The search ended (its worker limit, memory or budget) before the curve
                # flattened: say so, or the user takes the edge of the search for the peak.
                prev = max(fewer)
                memory_cap = (limits.memory_max_workers
                              if limits is not None and limits.memory_binds else None)
                if memory_cap is not None and pick >= memory_cap:
                    how = "memory allows no more here (see below)"
                elif limits is not None and pick >= limits.max_workers:
                    how = ("raise the limit (--max-workers, or \"Most workers to try\" on "
                           "the dashboard) to search further")
                else:
                    how = "a longer --budget-s searches further"
                why += (f" It was still rising when the search stopped ({prev} workers gave "
                        f"{rates[prev]:.0f}), so more workers may pay: {how}.")
    else:
        why = (f"{pick} workers gave {rates[pick]:.0f} samples/s, within "
               f"{FEWER_WORKERS_TOLERANCE:.0%} of the fastest ({best_n} workers, "
               f"{rates[best_n]:.0f} samples/s), with fewer processes and less memory.")
    return pick, why


def pick_fed(groups: dict[int, list[TrialResult]]) -> tuple[int, str]:
    """The fewest workers whose consumer idle is within 2 points of the best, among settings
    within 10% of the best throughput.

    Idle alone can mislead when the step runs on the CPU too: extra workers steal its cores,
    the step stretches and its idle share falls while the training as a whole gets slower.
    """
    medians = {n: median_idle(ts) for n, ts in groups.items()}
    idles = {n: i for n, i in medians.items() if i is not None}
    rates = {n: median_rate(groups[n]) for n in idles}
    top_rate = max(rates.values())
    fast = {n: i for n, i in idles.items() if rates[n] >= (1 - FED_RATE_TOLERANCE) * top_rate}
    best = min(fast.values())
    pick = min(n for n, i in fast.items() if i <= best + FED_TOLERANCE)
    step = statistics.median(t.step_ms or 0 for t in groups[pick])
    why = (f"Your step takes {step:.1f} ms per batch. With {pick} worker(s) it waits "
           f"{idles[pick]:.1%} of the time, within {FED_TOLERANCE * 100:.0f} points of the best "
           f"measured ({best:.1%}); more workers would only cost memory.")
    fewer = [n for n in idles if n < pick]
    if fewer:
        below = max(fewer)
        why += f" With {below} it waits {idles[below]:.1%}."
    least_idle = min(idles, key=lambda n: idles[n])
    if least_idle not in fast:
        why += (f" {least_idle} worker(s) waited least ({idles[least_idle]:.1%}) but ran at "
                f"{rates[least_idle]:.0f} samples/s against {rates[pick]:.0f}: their CPU use "
                "slowed the step itself.")
    return pick, why


def describe_profile(profile: CostProfile, limits: Limits) -> str:
    if profile.make_ms <= 1.2 * profile.receive_ms:
        # Without a consumer the "step" is the measuring loop's own microsecond.
        step = " (your step not included)" if profile.step_ms >= 0.05 else ""
        return (f"Batches are cheap to make: {profile.make_ms:.2f} ms each in the main "
                f"process{step}, while receiving one from a worker costs the main process "
                f"{profile.receive_ms:.2f} ms, so the hand-off between processes costs as much "
                "as the work it would spread.")
    if profile.cpu_share >= 0.6:
        kind = (f"CPU-bound: {profile.worker_cpu_ms:.1f} ms of CPU in each "
                f"{profile.worker_ms:.1f} ms batch, so throughput tops out near the "
                f"{limits.cpu_budget:g} CPU(s) this loader can use")
    elif profile.cpu_share <= 0.3:
        kind = (f"mostly waiting: only {profile.worker_cpu_ms:.1f} ms of CPU in each "
                f"{profile.worker_ms:.1f} ms batch, so workers beyond the "
                f"{limits.cpu_budget:g} usable CPU(s) still overlap the waits")
    else:
        kind = (f"mixed: {profile.cpu_share:.0%} of each {profile.worker_ms:.1f} ms batch is "
                "CPU work")
    return f"The dataset is {kind}."


def pin_memory_decision(chosen: list[TrialResult], limits: Limits) -> tuple[bool, str]:
    if not limits.gpu_available:
        return False, ("pin_memory=False: no GPU is visible, so pinned copies could not be "
                       "measured; pinning here would only cost locked RAM and a copy.")
    pageable = [t.h2d_ms for t in chosen if t.h2d_ms is not None and not t.pin_memory]
    pinned = [t.h2d_other_ms for t in chosen if t.h2d_other_ms is not None and not t.pin_memory]
    if not pageable or not pinned:
        return False, "pin_memory=False: host-to-device copies could not be timed on this GPU."
    page_ms, pin_ms = statistics.median(pageable), statistics.median(pinned)
    if pin_ms < (1 - PIN_GAIN) * page_ms:
        return True, (f"pin_memory=True: at this batch size a pinned copy took {pin_ms:.3f} ms "
                      f"against {page_ms:.3f} ms pageable ({page_ms / pin_ms:.1f}x faster).")
    return False, (f"pin_memory=False: pinned copies ({pin_ms:.3f} ms) were not clearly faster "
                   f"than pageable ones ({page_ms:.3f} ms) at this batch size.")


def persistent_decision(n: int, chosen: list[TrialResult], limits: Limits,
                        samples_per_s: float) -> tuple[bool, str | None]:
    if n == 0:
        return False, None
    startup = statistics.median(t.startup_s for t in chosen)
    batch = chosen[0].batch_size
    if limits.dataset_length is None:
        return True, (f"persistent_workers=True: starting {n} worker(s) took {startup:.2f} s "
                      "before the first batch, paid again every epoch otherwise.")
    # An epoch is len(dataset) items: samples, or whole batches when batch_size is None.
    items_per_s = samples_per_s if batch is not None else statistics.median(
        1000.0 / t.ms_per_batch for t in chosen)
    epoch_s = limits.dataset_length / items_per_s
    share = startup / epoch_s if epoch_s > 0 else 1.0
    if share >= PERSISTENT_SHARE:
        # what a restart adds beyond a steady batch, as the end's claim charges it (claim.py)
        charge = max(startup - statistics.median(t.ms_per_batch for t in chosen) / 1000.0, 0.0)
        saves = ""
        if charge > 0 and epoch_s > 0:
            restarted = samples_per_s * epoch_s / (epoch_s + charge)
            saves = (f"; keeping them saves that: ~{samples_per_s:.0f} samples/s over the "
                     f"epoch against ~{restarted:.0f} with the same {n} worker(s) restarted "
                     "each epoch")
        return True, (f"persistent_workers=True: restarting {n} worker(s) costs {startup:.2f} s "
                      f"per epoch, {share:.1%} of a {epoch_s:.1f} s epoch "
                      f"({limits.dataset_length} items, batch_size={batch}){saves}.")
    return False, (f"persistent_workers=False: worker start-up ({startup:.2f} s) is under "
                   f"{PERSISTENT_SHARE:.0%} of a {epoch_s:.0f} s epoch.")


def prefetch_decision(n: int, chosen: list[TrialResult], has_consumer: bool
                      ) -> tuple[int | None, str | None]:
    if n == 0:
        return None, None
    cvs = [t.worker_ms_cv for t in chosen if t.worker_ms_cv is not None]
    cv = statistics.median(cvs) if cvs else 0.0
    idle = median_idle(chosen)
    if cv > BURSTY_CV and (not has_consumer or (idle or 0) > FED_TOLERANCE):
        return 4, (f"prefetch_factor=4: batch times vary a lot (coefficient of variation "
                   f"{cv:.2f}), so a deeper queue absorbs slow batches.")
    return None, (f"prefetch_factor left at 2: batch times are steady (coefficient of "
                  f"variation {cv:.2f}).")


def main_process_reason(groups: dict[int, list[TrialResult]], has_consumer: bool) -> str:
    """Why num_workers=0, against the fastest worker count measured and the tolerance the
    pick actually allowed."""
    rate = median_rate(groups[0])
    rates = {n: median_rate(ts) for n, ts in groups.items() if n > 0}
    best = max(rates, key=lambda n: rates[n])
    if rate >= rates[best]:
        return (f"Loading in the main process beats worker processes here ({rate:.0f} "
                f"samples/s against {rates[best]:.0f} at best, with {best}): handing each batch "
                "between processes costs more than making it.")
    tolerance = FED_RATE_TOLERANCE if has_consumer else FEWER_WORKERS_TOLERANCE
    why = "keeps your step as fed" if has_consumer else "is that close"
    return (f"Loading in the main process is {1 - rate / rates[best]:.0%} slower than the "
            f"fastest worker count ({rate:.0f} samples/s against {rates[best]:.0f} with "
            f"{best}); within the {tolerance:.0%} allowed, the main process {why} without the "
            "workers' memory and start-up.")


def recommend(trials: list[TrialResult], profile: CostProfile | None, limits: Limits,
              has_consumer: bool, batch_size: int | None, by_rate: bool | None = None
              ) -> Recommendation:
    """``by_rate``: pick the fastest loop even with a consumer (a step on the CPU: NOTE
    [ A step on the CPU ], tuner.py); by default only without one."""
    by_rate = not has_consumer if by_rate is None else by_rate
    cap = limits.memory_max_workers
    # Counts whose batches would not fit in memory or /dev/shm are never picked, measured or not.
    groups = by_workers([t for t in trials if not t.pin_memory and t.prefetch_factor is None
                         and (cap is None or t.num_workers <= cap)])
    n, why = pick_fastest(groups, limits) if by_rate else pick_fed(groups)
    if by_rate and has_consumer:
        step = statistics.median(t.step_ms or 0 for t in groups[n])
        why = (f"Your step works the CPU too ({step:.0f} ms a batch with {n} worker(s)): "
               "workers take its cores and stretch it, so the pick is the fastest training "
               f"loop, not the least idle step. {why}")
    chosen = groups[n]
    rate = median_rate(chosen)
    reasons = []
    if profile is not None:
        reasons.append(describe_profile(profile, limits))
    reasons.append(why)
    if 0 in groups and n != 0:
        base = median_rate(groups[0])
        reasons.append(f"That is {rate / base:.1f}x the {base:.0f} samples/s of num_workers=0.")
    elif n == 0 and len(groups) > 1:
        reasons.append(main_process_reason(groups, has_consumer))
    if limits.memory_binds:
        reasons.append(f"Memory allows at most {limits.memory_max_workers} workers here "
                       "(worker memory plus batches in flight against free RAM and /dev/shm"
                       + (f", for each of the node's {limits.local_world_size} ranks"
                          if limits.local_world_size > 1 else "") + ").")
    nodes = [t.node_samples_per_s for t in chosen if t.node_samples_per_s]
    if limits.local_world_size > 1 and nodes:
        reasons.append(f"Measured with {limits.local_world_size} loaders running at once, one "
                       f"per rank as on a node of {limits.local_world_size} ranks: {rate:.0f} "
                       f"samples/s per rank, {statistics.median(nodes):.0f} for the node.")
    elif limits.local_world_size > 1:
        reasons.append(f"The machine's CPUs are shared by {limits.local_world_size} ranks: "
                       f"{limits.cpu_budget:g} CPU(s) for this one.")
    pin, pin_reason = pin_memory_decision(chosen, limits)
    persistent, persistent_reason = persistent_decision(n, chosen, limits, rate)
    prefetch, prefetch_reason = prefetch_decision(n, chosen, has_consumer)
    cap = limits.memory_max_workers
    if prefetch is not None and cap is not None and n * prefetch > 2 * cap:
        # The memory cap holds at prefetch_factor=2: a deeper queue would not fit.
        prefetch, prefetch_reason = None, (
            f"prefetch_factor left at 2: {prefetch} batches in flight per worker would not fit "
            "in the memory and /dev/shm that cap the workers.")
    reasons += [r for r in (pin_reason, persistent_reason, prefetch_reason) if r]
    kwargs: dict[str, int | bool | None] = {"batch_size": batch_size, "num_workers": n,
                                            "pin_memory": pin}
    if n > 0:
        kwargs["persistent_workers"] = persistent
        if prefetch is not None:
            kwargs["prefetch_factor"] = prefetch
    warnings = []
    spread = spread_pct(chosen)
    if spread is not None and spread > 10:
        warnings.append(Diagnostic(
            "noisy_machine", "warning", f"Repeated measurements of the pick varied by "
            f"±{spread:.0f}%: other load on this machine makes the numbers uncertain.",
            {"spread_pct": round(spread, 1)}))
    return Recommendation(kwargs, rate, uncertainty_pct(chosen), tuple(reasons), tuple(warnings),
                          conclusive=all(t.conclusive for t in chosen))
