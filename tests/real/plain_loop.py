"""Measure a target module with a plain ``torch.utils.data.DataLoader``, independently of the
tool: its own module loading, its own timing (``time.monotonic``) and its own sample count.

``plain_rate(target, seconds, **overrides)`` builds ``DataLoader(dataset, **settings)`` with
exactly the module's settings (``batch_size`` including ``None``, ``collate_fn``,
``sampler`` (called with the dataset when it is a callable and not a Sampler),
``dataloader_kwargs``, ``worker_init_fn``), the overrides on top, and iterates it for
``seconds`` after a warm-up of ``max(1, num_workers * prefetch_factor)`` batches.

Options (keyword-only, never passed to the DataLoader):
- ``with_step=True``: a training loop: each batch, once fetched, is passed to the module's
  ``train_step`` (warm-up batches too, as in a job); the rate is samples/s of the whole loop.
- ``min_batches``: also time at least this many batches (slow batches: ``seconds`` alone
  would time a handful).
- ``whole_epochs=True``: when an epoch has no more batches than the warm-up or
  ``min_batches`` (a short epoch), the first epoch is the warm-up and whole epochs are timed,
  from one epoch's start (``iter(loader)``: non-persistent workers restarting) to an epoch's
  end, so the restarts are paid as a job of many epochs pays them.

Samples are counted without looking at what the tool would:
- map-style with auto-batching: the indices the batch sampler hands out, by wrapping it;
- iterable with auto-batching: the items handed to the collate function (the batch
  sampler's indices are placeholders there, and each worker's last batch can be short);
- ``batch_size=None``: the leading dimension of the first tensor in each yielded item.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
import os
import sys
import time
from types import ModuleType
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler
from torch.utils.data._utils.collate import default_collate

FACTORY_NAMES = ("make_dataset", "get_dataset", "dataset")


def load_module(target: str | ModuleType) -> tuple[ModuleType, str | None]:
    """A module object, ``path/to/file.py[:attr]`` or ``dotted.module[:attr]``."""
    if isinstance(target, ModuleType):
        return target, None
    spec, _, attr = target.rpartition(":") if ":" in target else (target, "", "")
    attr = attr or None
    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec)
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # sibling imports (_data) work as in a script
        name = os.path.splitext(os.path.basename(path))[0]
        existing = sys.modules.get(name)
        if existing is not None:
            if os.path.abspath(getattr(existing, "__file__", None) or "") == path:
                return existing, attr
            name = "_plain_loop_" + name  # another module has that name: do not replace it
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # so workers can unpickle classes defined in it
        module_spec.loader.exec_module(module)
        return module, attr
    return importlib.import_module(spec), attr


def build_dataset(module: ModuleType, attr: str | None = None):
    """The named attribute, else the first of make_dataset / get_dataset / dataset: an
    instance is used as is (duck-typed ones too), a class or a factory is called."""
    for name in (attr,) if attr else FACTORY_NAMES:
        obj = getattr(module, name, None)
        if obj is None:
            continue
        if isinstance(obj, Dataset) or not callable(obj):
            return obj
        return obj()
    raise LookupError(f"{module.__name__} has none of {(attr,) if attr else FACTORY_NAMES}")


def loader_settings(module: ModuleType, dataset, **overrides) -> dict:
    """The DataLoader keyword arguments the module asks for, overrides on top."""
    settings: dict[str, Any] = {}
    if hasattr(module, "batch_size"):
        settings["batch_size"] = module.batch_size  # None is meaningful: no auto-batching
    for name in ("collate_fn", "worker_init_fn"):
        if getattr(module, name, None) is not None:
            settings[name] = getattr(module, name)
    sampler = getattr(module, "sampler", None)
    if sampler is not None:
        if callable(sampler) and not isinstance(sampler, Sampler):
            sampler = sampler(dataset)
        settings["sampler"] = sampler
    settings.update(getattr(module, "dataloader_kwargs", None) or {})
    settings.update(overrides)
    return settings


class CountingBatchSampler(Sampler):
    """Wraps a batch sampler, recording the size of each index list in the order handed out
    (the DataLoader returns batches in that order unless ``in_order=False``)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.sizes: collections.deque[int] = collections.deque()

    def __iter__(self):
        for indices in self.inner:
            self.sizes.append(len(indices))
            yield indices

    def __len__(self) -> int:
        return len(self.inner)


class CountingCollate:
    """Returns ``(number of samples collated, collated batch)``; picklable for spawn."""

    def __init__(self, collate: Callable | None) -> None:
        self.collate = collate or default_collate

    def __call__(self, samples):
        return len(samples), self.collate(samples)


def leading_dim(item) -> int:
    """The leading dimension of the first tensor found in a whole-batch item."""
    if isinstance(item, torch.Tensor):
        return int(item.shape[0]) if item.dim() else 1
    if isinstance(item, collections.abc.Mapping):
        values = list(item.values())
    elif isinstance(item, (list, tuple)):
        values = list(item)
    else:
        values = []
    for value in values:
        try:
            return leading_dim(value)
        except ValueError:
            continue
    raise ValueError(f"no tensor in a {type(item).__name__}")


def counting_loader(dataset, settings: dict) -> tuple[DataLoader, Callable[[Any], tuple[int, Any]]]:
    """The DataLoader to iterate and a function turning what it yields into (samples, batch)."""
    plain = DataLoader(dataset, **settings)  # validates the settings exactly as the user's would
    if plain.batch_size is None and plain.batch_sampler is None:
        return plain, lambda item: (leading_dim(item), item)
    if isinstance(dataset, IterableDataset):
        settings = dict(settings, collate_fn=CountingCollate(settings.get("collate_fn")))
        return DataLoader(dataset, **settings), lambda item: item
    counter = CountingBatchSampler(plain.batch_sampler)
    rest = {k: v for k, v in settings.items()
            if k not in ("batch_size", "shuffle", "sampler", "drop_last", "batch_sampler")}
    loader = DataLoader(dataset, batch_sampler=counter, **rest)
    return loader, lambda item: (counter.sizes.popleft(), item)


def _shutdown(iterator) -> None:
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def plain_rate(module_path_or_target: str | ModuleType, seconds: float, *,
               with_step: bool = False, min_batches: int = 0, whole_epochs: bool = False,
               **overrides) -> dict:
    """Samples per second of a plain DataLoader with the module's settings (a training loop
    through the module's ``train_step`` with ``with_step=True``).

    Returns ``{"samples_per_s", "batches", "samples", "seconds", "epochs_timed"}`` counted
    after the warm-up (``epochs_timed``: whole epochs timed, None unless whole epochs are).
    An epoch that ends early is followed by a new one, as in training.
    """
    module, attr = load_module(module_path_or_target)
    step = None
    if with_step:
        step = getattr(module, "train_step", None)
        if not callable(step):
            raise LookupError(f"{module.__name__} has no train_step")
    dataset = build_dataset(module, attr)
    settings = loader_settings(module, dataset, **overrides)
    loader, unpack = counting_loader(dataset, settings)
    workers = loader.num_workers
    warmup = max(1, workers * (loader.prefetch_factor or 2))
    try:
        epoch_length = len(loader)
    except TypeError:  # an iterable dataset without __len__
        epoch_length = None
    by_epoch = bool(whole_epochs and epoch_length and epoch_length <= max(warmup, min_batches))
    seen = batches = samples = epochs = 0
    start = stop = None
    iterator = iter(loader)
    try:
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                if seen == 0:
                    break  # an empty epoch: nothing more will come
                if by_epoch:
                    if start is None:
                        start = time.monotonic()  # the warm-up was the first epoch
                    else:
                        epochs += 1
                        if (time.monotonic() - start >= seconds
                                and batches >= min_batches):
                            stop = time.monotonic()  # before the last shutdown
                            break
                if not loader.persistent_workers:
                    _shutdown(iterator)
                iterator, seen = iter(loader), 0  # the next epoch, as in training
                continue
            seen += 1
            count, batch = unpack(item)
            del item
            if step is not None:
                step(batch)
            del batch
            if start is None:
                if not by_epoch:
                    warmup -= 1
                    if warmup <= 0:
                        start = time.monotonic()
                continue
            batches += 1
            samples += count
            if (not by_epoch and time.monotonic() - start >= seconds
                    and batches >= min_batches):
                stop = time.monotonic()  # before the workers' shutdown
                break
    finally:
        _shutdown(iterator)
        del iterator
        loader._iterator = None  # a persistent_workers loader keeps its iterator here
    elapsed = ((stop if stop is not None else time.monotonic()) - start
               if start is not None else 0.0)
    return {"samples_per_s": samples / elapsed if elapsed > 0 else 0.0, "batches": batches,
            "samples": samples, "seconds": elapsed, "epochs_timed": epochs if by_epoch else None}


if __name__ == "__main__":
    import json

    print(json.dumps(plain_rate(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 5.0)))
