"""Watching a DataLoader inside the object the job, or its trainer, already holds.

A trainer builds and keeps its own loader object: accelerate's ``DataLoaderShard`` around a
plain DataLoader (the Hugging Face Trainer's too), Ray Train's ``_WrappedDataLoader`` around one, Lightning's loaders inside its
``CombinedLoader``, a user's DataLoader subclass. Wrapping one would hand the trainer something
else. Instead the watcher takes over the one step of ``DataLoader.__iter__`` that makes the
iterator, ``_get_iterator``, on that instance only: what the object or its wrapper does around
iteration (moving batches to the device, one batch ahead; skipping batches on resume;
``set_epoch``) stays theirs, and the batches come from the watcher's probed copy (rebuild.py),
with the same sampler and generator, as with ``watch(loader)``. ``DataLoader.__iter__`` keeps a
persistent_workers loader's iterator and calls its ``_reset`` at each epoch: there
``MeasuredIterator`` starts the watcher's next epoch.

Timed there, a batch's wait is the loader's: what a wrapper adds in the same ``next()`` (accelerate
moving the batch to the device) is in the step, as a loop's own ``.to(device)`` is.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader

from dataloader_tuner.watcher.frameworks import ACCELERATE, RAY_TRAIN
from dataloader_tuner.watcher.own_iterators import probe_on_instance

GET_ITERATOR = "_get_iterator"


# Where a wrapper keeps the plain DataLoader it iterates one batch ahead of the loop, and whose
# wrapper that is: accelerate's DataLoaderShard and DataLoaderDispatcher, and Ray Train's
# prepare_data_loader (its _WrappedDataLoader, a DataLoader subclass moving each batch to the
# device as it asks for the next).
WRAPPED_AS = {"base_dataloader": ACCELERATE, "_dataloader": RAY_TRAIN}


def inner_loader(wrapper: Any) -> DataLoader | None:
    """The plain DataLoader a wrapper iterates, where it keeps one (WRAPPED_AS; a
    StatefulDataLoader there is not plain: not taken)."""
    found = _wrapped(wrapper)
    return found[0] if found is not None else None


def wrapper_framework(wrapper: Any) -> str | None:
    """The trainer whose wrapper this is (WRAPPED_AS), or None."""
    found = _wrapped(wrapper)
    return found[1] if found is not None else None


def _wrapped(wrapper: Any) -> tuple[DataLoader, str] | None:
    held = getattr(wrapper, "__dict__", {})
    for key, framework in WRAPPED_AS.items():
        inner = held.get(key)
        if type(inner) is DataLoader and (key == "base_dataloader"
                                          or isinstance(wrapper, DataLoader)):
            return inner, framework
        if key == "base_dataloader" and isinstance(inner, DataLoader) and _asks_by_iter(inner):
            return inner, framework
    return None


def _asks_by_iter(inner: DataLoader) -> bool:
    """accelerate's use_stateful_dataloader shard holds a StatefulDataLoader and asks it for
    each epoch with ``base_dataloader.__iter__()``: watched inside it through an ``__iter__``
    set on that instance (attach), its own iterators made with the probes (own_iterators.py)."""
    return type(inner) is not DataLoader and probe_on_instance(inner)[0] is not None


def attach_blocker(loader: Any) -> str | None:
    """Why ``loader`` cannot be watched inside its own object, or None. Its class must make its
    iterators with DataLoader's own ``_get_iterator``, and its ``__iter__`` be DataLoader's or
    one that takes its batches from it (``super().__iter__()``, as far as its source says): a
    class that replaces them may never ask for the watcher's."""
    if not isinstance(loader, DataLoader):
        return f"{type(loader).__name__} is not a DataLoader"
    cls = type(loader)
    if not issubclass(cls, DataLoader):  # accelerate's stateful DataLoaderShard: a stand-in
        return (f"{cls.__name__} stands in for the {type(loader.__class__).__name__} it holds "
                "without being a DataLoader: its own iterators are not the watcher's to make")
    if getattr(cls, GET_ITERATOR) is not getattr(DataLoader, GET_ITERATOR):
        return (f"{cls.__name__} defines its own {GET_ITERATOR}: its batches may not come "
                "from DataLoader's iterator")
    own_iter = getattr(cls, "__iter__")
    if own_iter is not DataLoader.__iter__ and not _iterates_dataloaders(own_iter):
        return (f"{cls.__name__} defines its own __iter__, which does not take its batches "
                "from DataLoader's (super().__iter__())")
    return None


# super().__iter__(), super(Cls, self).__iter__(), DataLoader.__iter__(self)
_DATALOADERS_ITER = re.compile(r"super\(\s*(\w+\s*,\s*\w+\s*)?\)\.__iter__\(|"
                               r"DataLoader\.__iter__\(\s*self")


def _iterates_dataloaders(method: Any) -> bool:
    """Whether a subclass's own ``__iter__`` gets its batches from DataLoader's: read from its
    source (none to read: no). What it does around them (a transform, a device copy) stays its
    own, in the step, as accelerate's is."""
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        return False
    return _DATALOADERS_ITER.search(source) is not None


class MeasuredIterator:
    """What the watched loader's ``__iter__`` returns: one of the watcher's epochs, started
    again by DataLoader's ``_reset`` where the loader keeps its workers between epochs."""

    def __init__(self, loader: DataLoader, epoch: Callable[[], Iterator[Any]]) -> None:
        self._loader, self._epoch = loader, epoch
        self._batches = epoch()

    def __iter__(self) -> "MeasuredIterator":
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def __len__(self) -> int:
        return len(self._loader)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()  # an epoch broken off: its bookkeeping ends with it
        self._batches = self._epoch()


def attach(loader: DataLoader, epoch: Callable[[], Iterator[Any]]) -> None:
    """From now on ``iter(loader)`` runs ``epoch()`` (attach_blocker said it may); for a
    subclass making its own iterators, held by accelerate's stateful shard, ``loader.__iter__()``
    (_asks_by_iter)."""
    if attach_blocker(loader) is not None:
        loader.__iter__ = epoch  # type: ignore[method-assign,assignment]  # (the shard's call)
        return
    # Set on the instance (DataLoader forbids only its sampling attributes after construction).
    def measured() -> Any:  # (DataLoader types it as its own iterator class)
        return MeasuredIterator(loader, epoch)

    loader._get_iterator = measured  # type: ignore[method-assign]
    loader._iterator = None  # a persistent iterator made before: the next epoch is ours


def detach(loader: DataLoader) -> None:
    """The loader's own iterators again (the run ended)."""
    loader.__dict__.pop(GET_ITERATOR, None)
    loader.__dict__.pop("__iter__", None)
    if isinstance(loader.__dict__.get("_iterator"), MeasuredIterator):
        loader._iterator = None


def attached(loader: Any) -> bool:
    return GET_ITERATOR in getattr(loader, "__dict__", {})
