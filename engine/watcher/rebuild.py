"""The user's DataLoader, rebuilt with the engine's timing probes, yielding the same batches.

Why rebuild rather than wrap: per-worker fetch and collate times are only known inside the
workers, and they travel with each batch (probes.py). The copy shares the original's dataset,
sampler objects and generator, so it draws exactly the indices the original would have drawn,
in the same order, and seeds its workers from the same generator: the model sees the same
batches. The original is never iterated.

Where that cannot be promised (a DataLoader subclass may override anything), nothing is rebuilt:
the watcher times the training loop's side only and says so.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from dataloader_tuner.instrument.probes import RecordingBatchSampler, timed_collate, wrap_dataset
from dataloader_tuner.instrument.stacks import OfferingStack
from dataloader_tuner.config import LoaderConfig


def instrumented(loader: DataLoader, any_class: bool = False
                 ) -> tuple[DataLoader | None, str | None]:
    """(the probed copy, None), or (None, why not). ``any_class``: a subclass too, its copy a
    plain DataLoader: for a loader watched in place (attach.py), whose own class still does
    what it adds around DataLoader's iterator."""
    if type(loader) is not DataLoader and not any_class:
        return None, (f"{type(loader).__name__} is not a plain DataLoader (a subclass or a "
                      "loader of another library): the watcher times your loop's side only "
                      "(waits, steps, samples), not the workers'")
    kwargs = copy_kwargs(loader, loader.num_workers, loader.prefetch_factor,
                         loader.persistent_workers, loader.generator)
    if isinstance(loader.dataset, IterableDataset):
        # DataLoader batches an iterable itself (an endless placeholder sampler underneath).
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:  # batches DataLoader makes
        # The very object (same indices, same order)
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    try:
        return with_probes(loader, kwargs), None
    except Exception as exc:  # noqa: BLE001 - never break the user's job: time the loop only
        return None, (f"the loader could not be rebuilt with probes ({type(exc).__name__}: "
                      f"{exc}): the watcher times your loop's side only")


def with_probes(loader: DataLoader, kwargs: dict[str, Any]) -> DataLoader:
    """A DataLoader over ``loader``'s dataset with ``kwargs`` (copy_kwargs'), its dataset and
    collate function timed, each worker offering its stack, and its batch sampler's batches
    remembered by position with workers: a late batch's indices (instrument/stalls.py)."""
    workers = kwargs["num_workers"]
    batches = kwargs.get("batch_sampler")
    if batches is not None and workers:
        kwargs["batch_sampler"] = RecordingBatchSampler(
            batches, workers * (kwargs.get("prefetch_factor") or 2))
    auto_collation = batches is not None or kwargs.get("batch_size", 1) is not None
    kwargs["collate_fn"] = timed_collate(loader.collate_fn, auto_collation)
    if workers:  # a worker stuck before its first fetch is named too
        kwargs["worker_init_fn"] = OfferingStack(loader.worker_init_fn)
    return DataLoader(wrap_dataset(loader.dataset), **kwargs)


def copy_kwargs(loader: DataLoader, num_workers: int, prefetch_factor: int | None,
                persistent_workers: bool, generator: Any) -> dict:
    """DataLoader arguments for a copy of ``loader`` with its own worker settings: everything
    else as the loader has it (worker-only ones only with workers, as DataLoader requires).
    The probed copy, the in-place search's loaders and its final pick are all made from it."""
    kwargs: dict[str, Any] = {"num_workers": num_workers, "collate_fn": loader.collate_fn,
                              "pin_memory": loader.pin_memory, "timeout": loader.timeout,
                              "worker_init_fn": loader.worker_init_fn, "generator": generator}
    if num_workers:
        kwargs.update(multiprocessing_context=loader.multiprocessing_context,
                      prefetch_factor=prefetch_factor or 2,
                      persistent_workers=persistent_workers)
    if getattr(loader, "pin_memory_device", ""):
        kwargs["pin_memory_device"] = loader.pin_memory_device
    if hasattr(loader, "in_order"):  # torch >= 2.6
        kwargs["in_order"] = loader.in_order
    return kwargs


def config_of(loader: DataLoader) -> LoaderConfig:
    """The settings a loader was made with, as far as they can be read back from it."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
    from torch.utils.data._utils.collate import default_collate, default_convert

    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    batch_size, drop_last = getattr(loader, "batch_size", None), getattr(loader, "drop_last", False)
    if type(batch_sampler) is BatchSampler and batch_size is None:
        # Made with batch_sampler=BatchSampler(...) (accelerate's prepared loaders are): the
        # settings are the batch sampler's.
        sampler, batch_size = batch_sampler.sampler, batch_sampler.batch_size
        drop_last = batch_sampler.drop_last
    shuffle = type(sampler) is RandomSampler
    plain_sampler = type(sampler) in (RandomSampler, SequentialSampler) or (
        type(sampler).__name__ == "_InfiniteConstantSampler")
    custom_batches = batch_sampler is not None and type(batch_sampler) is not BatchSampler
    collate = getattr(loader, "collate_fn", None)
    workers = int(getattr(loader, "num_workers", 0) or 0)
    return LoaderConfig(
        batch_size=None if custom_batches else batch_size,
        shuffle=shuffle and not custom_batches,
        sampler=None if plain_sampler or custom_batches else sampler,
        batch_sampler=batch_sampler if custom_batches else None,
        num_workers=workers,
        collate_fn=None if collate in (default_collate, default_convert) else collate,
        pin_memory=bool(getattr(loader, "pin_memory", False)),
        drop_last=bool(drop_last),
        timeout=getattr(loader, "timeout", 0) or 0,
        worker_init_fn=getattr(loader, "worker_init_fn", None),
        multiprocessing_context=getattr(loader, "multiprocessing_context", None) if workers
        else None,
        # 2 is DataLoader's default with workers, which the config writes as None
        prefetch_factor=(None if not workers or getattr(loader, "prefetch_factor", 2) == 2
                         else loader.prefetch_factor),
        persistent_workers=bool(getattr(loader, "persistent_workers", False)) and workers > 0,
        in_order=bool(getattr(loader, "in_order", True)),
    )
