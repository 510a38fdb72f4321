"""Caching measured: the pick's settings over samples the dataset already made, served again
from RAM (NOTE [ The ceiling and what would raise it ], analyse/ceiling.py): what keeping every
sample's output would give, against the same settings uncached. A trial, not the job: what the
model sees is untouched."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.child.trial_run import TrialRunner
from dataloader_tuner.instrument.tensors import payload_bytes
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.plan import CACHE_GATHER_S, CACHE_TRIALS

CACHE_BYTES = 256 * 2**20  # at most this much of samples held for the trial
CACHE_SAMPLES = 8192
GATHER_S = CACHE_GATHER_S  # at most this long making the samples to hold (the plan counts it)
MIN_BATCHES_HELD = 8  # fewer samples than this many batches: the cache would not tell


class CachedSamples(Dataset):
    """The samples made, over and over: index ``i`` is sample ``i % held``. Its length is the
    dataset's, so that epochs (and workers restarted with them) come as often as uncached."""

    def __init__(self, samples: list[Any], length: int) -> None:
        self.samples, self.length = samples, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.samples[index % len(self.samples)]


def cached_samples(dataset: Any, batch_size: int | None) -> CachedSamples | None:
    """The dataset's first samples (CACHE_SAMPLES, CACHE_BYTES, GATHER_S at most), or None
    where a cache cannot be measured (an iterable dataset, no length, too few made)."""
    if isinstance(dataset, IterableDataset) or not batch_size:
        return None
    try:
        length = len(dataset)
    except TypeError:
        return None
    needed = MIN_BATCHES_HELD * batch_size
    samples: list[Any] = []
    held = 0
    deadline = time.monotonic() + GATHER_S
    try:  # (the tune has its pick: a sample that fails here costs only this measurement)
        for index in range(min(length, CACHE_SAMPLES)):
            sample = dataset[index]
            samples.append(sample)
            held += payload_bytes(sample)
            if index == 0 and held * needed > CACHE_BYTES:
                return None  # samples this large: too few would fit to tell
            if held >= CACHE_BYTES or time.monotonic() > deadline:
                break
    except Exception:  # noqa: BLE001 - the user's dataset, outside the tune's own trials
        return None
    return CachedSamples(samples, length) if len(samples) >= needed else None


def measure_cached(runner: TrialRunner, config: LoaderConfig
                   ) -> tuple[list[TrialResult], int] | None:
    """CACHE_TRIALS trials of ``config`` over the cached samples (their spread says how well
    the rate is known): (the trials, samples held)."""
    if config.multiprocessing_context is not None:  # (spawned workers would each get a copy)
        return None
    cache = cached_samples(runner.resolved.dataset, config.batch_size)
    if cache is None:
        return None
    over_cache = TrialRunner(replace(runner.resolved, dataset=cache), runner.consumer,
                             lambda t: None, runner.time_limit)
    trials = [over_cache.measure(config, "cached", repeat, report=False)
              for repeat in range(CACHE_TRIALS)]
    kept = [t for t in trials if t is not None]
    return (kept, len(cache.samples)) if kept else None
