"""Whether two loader configs run alike: what a trial's rate depends on, as DataLoader applies
the settings (the claim compares the pick with the user's settings only where they differ)."""

from __future__ import annotations

from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.instrument.heap import keeps_freed_memory
from dataloader_tuner.instrument.threads import limits_threads


def setting(num_workers: int, prefetch_factor: int | None, pin_memory: bool
            ) -> tuple[int, int | None, bool]:
    """What a trial's rate depends on, as DataLoader applies it (prefetch only with workers)."""
    return (num_workers, (prefetch_factor or 2) if num_workers else None, bool(pin_memory))


def same_settings(a: LoaderConfig, b: LoaderConfig) -> bool:
    """Two configs DataLoader runs alike (prefetch_factor None is 2 with workers)."""
    return (setting(a.num_workers, a.prefetch_factor, a.pin_memory)
            == setting(b.num_workers, b.prefetch_factor, b.pin_memory)
            and bool(a.persistent_workers and a.num_workers)
            == bool(b.persistent_workers and b.num_workers)
            and a.batch_size == b.batch_size
            and (a.in_order or not a.num_workers) == (b.in_order or not b.num_workers)
            and threads_limited(a) == threads_limited(b)
            and keeps_memory(a) == keeps_memory(b))


def threads_limited(config: LoaderConfig) -> bool:
    """Each worker's thread pools limited to one thread, by the setting or the user's own
    worker_init_fn (instrument/threads.py)."""
    return bool(config.num_workers) and (config.worker_threads == 1
                                         or limits_threads(config.worker_init_fn))


def keeps_memory(config: LoaderConfig) -> bool:
    """Each worker keeps the memory it frees, by the setting or the user's own worker_init_fn
    (instrument/heap.py)."""
    return bool(config.num_workers) and (config.keep_freed_memory
                                         or keeps_freed_memory(config.worker_init_fn))
