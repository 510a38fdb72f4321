"""Worker-side probes for a DataLoader subclass that makes its own iterators (torchdata's
StatefulDataLoader, streaming loaders, a repository's ResumableDataLoader).

NOTE [ Probing a loader that makes its own iterators ]

    Such a loader is neither rebuilt as a plain DataLoader (its iterator keeps the place that
    ``state_dict()`` reads) nor given a wrapped dataset (DataLoader forbids setting ``dataset``
    after construction, and torchdata's workers read the dataset's own ``state_dict``). What
    DataLoader does let a user set on the instance is set there while the subclass makes an
    iterator, and put back as soon as it has (watcher/own_iterators.py): its ``collate_fn``
    (timed_collate's, which tags each batch with where and how it was made) and its
    ``worker_init_fn`` (TimedFetchInit, below). The iterator and its workers keep what they
    were made with; the loader's attributes read as the user set them at every other moment.

    In each worker, before the fetcher is made from it, TimedFetchInit gives the worker's copy
    of the dataset a class of its own: the user's class with a ``__getitems__`` that fetches
    as before through a TimedMapDataset (probes.py), so each batch's fetch is timed and a
    worker's first fetch is probed and offers its stack. The worker's copy only: the training
    process's object is never touched, and the state the worker reports (its dataset's
    ``state_dict``) is the user's class's own. A dataset whose class cannot take a subclass
    (a builtin such as a list) is not probed: own_iterators.py checks it before.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.utils.data import get_worker_info

from dataloader_tuner.instrument.probes import TimedMapDataset
from dataloader_tuner.instrument.stacks import OfferingStack

_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class written in Python, whose instances may move
_timed_classes: dict[type, type] = {}
_fetching: TimedMapDataset | None = None  # this worker's timed fetch, once TimedFetchInit ran


def can_time_fetch(dataset: Any) -> bool:
    """Whether a worker's copy of ``dataset`` can take the timed class (see the NOTE)."""
    cls = type(dataset)
    return bool(cls.__flags__ & _HEAP_TYPE) and not cls.__itemsize__


def timed_class(cls: type) -> type:
    """``cls`` with a timed ``__getitems__``, named as ``cls`` is (made once per class)."""
    made = _timed_classes.get(cls)
    if made is None:
        made = type(cls.__name__, (cls,), {"__getitems__": _timed_getitems, "__slots__": (),
                                           "__qualname__": cls.__qualname__,
                                           "__module__": cls.__module__})
        _timed_classes[cls] = made
    return made


def _timed_getitems(self: Any, indices: list) -> list:
    return _fetching.__getitems__(indices)  # type: ignore[union-attr]  # set before any fetch


class TimedFetchInit(OfferingStack):
    """The worker_init_fn set while a subclass makes an iterator: the worker's dataset fetches
    through a TimedMapDataset from its first batch; then its stack is offered and the user's
    own worker_init_fn runs, as OfferingStack does."""

    def __init__(self, init_fn: Callable[[int], Any] | None) -> None:
        super().__init__(init_fn)

    def __call__(self, worker_id: int) -> None:
        global _fetching
        info = get_worker_info()
        if info is not None and can_time_fetch(info.dataset):
            dataset = info.dataset
            _fetching = TimedMapDataset(dataset)  # (its fetch read before the class changes)
            dataset.__class__ = timed_class(type(dataset))
        super().__call__(worker_id)
