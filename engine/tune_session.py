"""Tuning inside the engine's child process: real trials for the search in tuner.py.

All trials run in the one child (torch is imported once), each with a fresh DataLoader whose
workers are shut down before the next trial starts.
"""

from __future__ import annotations

import time
from typing import Callable

import psutil

from .config import LoaderConfig
from .measure import Consumer, Measurement
from .metrics import warmup_batches
from .recommend import Limits
from .target import ResolvedTarget
from .trials import TrialResult, summarize_trial
from .tuner import Tuner, TrialSpec, TuneOutcome

MIN_STEADY_BATCHES = 8
MIN_WINDOW_S = 0.6
PREWARM_S = 0.4
MAX_TRIAL_S = 3.0


def workers_private_mb() -> float | None:
    """Mean memory per worker not shared with the parent (RSS minus shared pages)."""
    sizes = []
    for child in psutil.Process().children():
        try:
            info = child.memory_info()
            sizes.append((info.rss - getattr(info, "shared", 0)) / 2**20)
        except psutil.Error:
            pass
    return sum(sizes) / len(sizes) if sizes else None


def measure_trial(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
                  phase: str, repeat: int, max_trial_s: float = MAX_TRIAL_S) -> TrialResult | None:
    """One steady-state measurement: stops once enough batches after warm-up were seen."""
    warmup = warmup_batches(config.num_workers, config.effective_prefetch_factor)
    records: list = []
    started = time.monotonic()

    def enough() -> bool:
        if time.monotonic() - started > max_trial_s:
            return True
        if len(records) < warmup + MIN_STEADY_BATCHES:
            return False
        window = records[-1].t_ready - records[warmup - 1].t_ready
        return window >= MIN_WINDOW_S

    cpu_before = time.process_time()
    measurement = Measurement(resolved, config, consumer, max_trial_s, records.append, enough)
    try:
        measurement.run()
        main_cpu = time.process_time() - cpu_before
        private = workers_private_mb() if config.num_workers else None
    finally:
        measurement.close()
    return summarize_trial(
        records, warmup,
        num_workers=config.num_workers, prefetch_factor=config.prefetch_factor,
        persistent_workers=config.persistent_workers, pin_memory=config.pin_memory,
        batch_size=config.batch_size, seconds=time.monotonic() - started,
        has_consumer=consumer.kind != "none", main_cpu_s=main_cpu, worker_private_mb=private,
        phase=phase, repeat=repeat,
    )


def run_tune(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer, system: dict,
             request: dict, on_trial: Callable[[TrialResult], None]) -> dict:
    """Search, then measure the module's own settings as the baseline; returns the document."""
    try:
        length = len(resolved.dataset)
    except TypeError:
        length = None
    limits = Limits.from_system(system, int(request.get("local_world_size") or 1),
                                int(request.get("max_workers") or 32), length)
    search_config = config.replace(num_workers=0, pin_memory=False, prefetch_factor=None,
                                   persistent_workers=False)

    def measure(spec: TrialSpec) -> TrialResult | None:
        trial_config = search_config.replace(num_workers=spec.num_workers)
        return measure_trial(resolved, trial_config, consumer, spec.phase, spec.repeat)

    started = time.monotonic()
    # The first batches in a fresh process pay for page faults, allocator growth and lazy
    # imports; an untimed pass keeps that out of the first probe.
    measure_trial(resolved, search_config, consumer, "prewarm", 0, max_trial_s=PREWARM_S)
    tuner = Tuner(measure, limits, system, has_consumer=consumer.kind != "none",
                  step_on_cpu=consumer.kind == "train_step",
                  budget_s=float(request.get("budget_s") or 45.0),
                  batch_size=config.batch_size, on_trial=on_trial)
    outcome = tuner.run()
    baseline = _baseline(resolved, config, consumer, outcome, on_trial, request.get("baseline"))
    return tune_document(outcome, baseline, config, time.monotonic() - started)


def _baseline(resolved: ResolvedTarget, config: LoaderConfig, consumer: Consumer,
              outcome: TuneOutcome, on_trial: Callable[[TrialResult], None],
              current: dict | None = None) -> dict:
    """What the recommendation is compared with: the caller's current settings (the
    dashboard's controls) if given, else the module's declared ``dataloader_kwargs``, else
    ``num_workers=0``."""
    declared = current or resolved.dataloader_kwargs
    if declared:
        base = LoaderConfig.from_settings(dict(declared), config.replace(num_workers=0))
        trial = measure_trial(resolved, base, consumer, "baseline", 0)
        if trial is not None:
            outcome.trials.append(trial)
            on_trial(trial)
        source = "your current settings" if current else "the module's dataloader_kwargs"
    else:
        base = config.replace(num_workers=0)
        zeros = [t for t in outcome.trials if t.num_workers == 0]
        trial = zeros[0] if zeros else None
        source = "num_workers=0 (the module declares no dataloader_kwargs)"
    rate = trial.samples_per_s if trial else None
    expected = outcome.recommendation.expected_samples_per_s
    return {
        "source": source,
        "config": base.to_json_dict(),
        "samples_per_s": rate,
        "consumer_idle_frac": trial.consumer_idle_frac if trial else None,
        "speedup": expected / rate if rate else None,
    }


def tune_document(outcome: TuneOutcome, baseline: dict, config: LoaderConfig,
                  seconds: float) -> dict:
    rec = outcome.recommendation
    recommended = {k: v for k, v in rec.kwargs.items() if v is not None}
    snippet = LoaderConfig.from_settings(recommended, config.replace(num_workers=0)).snippet()
    chosen = [t for t in outcome.trials if t.num_workers == rec.kwargs["num_workers"]
              and t.phase != "baseline"]
    warnings = list(rec.warnings)
    base_rate = baseline.get("samples_per_s")
    if base_rate and rec.expected_samples_per_s and base_rate > 1.05 * rec.expected_samples_per_s:
        warnings.append({
            "code": "baseline_faster",
            "message": f"The baseline ({baseline['source']}) measured {base_rate:.0f} samples/s, "
                       f"more than the pick's {rec.expected_samples_per_s:.0f}. The machine's "
                       "load may have shifted during tuning: verify before switching.",
        })
    return {
        "recommended": recommended,
        "snippet": snippet,
        "expected_samples_per_s": rec.expected_samples_per_s,
        "expected_consumer_idle_frac": chosen[0].consumer_idle_frac if chosen else None,
        "uncertainty_pct": rec.uncertainty_pct,
        "baseline": baseline,
        "trials": [t.to_dict() for t in outcome.trials],
        "reasons": rec.reasons,
        "warnings": warnings,
        "profile": outcome.profile.to_dict() if outcome.profile else None,
        "limits": outcome.limits.__dict__,
        "tuning_seconds": seconds,
        "trial_seconds": sum(t.seconds for t in outcome.trials),
    }
