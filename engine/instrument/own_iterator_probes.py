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
    of the dataset a class of its own: the user's, with a ``__getitems__`` that fetches as
    before through a TimedMapDataset (probes.py), so each batch's fetch is timed and a worker's
    first fetch is probed and offers its stack. An IterableDataset's class gets an ``__iter__``
    whose items are timed as they are pulled, keeping whatever state the loader saves: where
    the user's ``__iter__`` returns the dataset itself (its own iterator) or an iterator object
    of a Python class (which may have a ``state_dict`` the loader saves), that object's class
    gets a timed ``__next__`` and the object stays the one the loader reads its state from; a
    generator (which has no state to save) is drawn through probes.timed_items. The worker's
    copy only: the training process's objects are never touched, and the state the worker
    reports is the user's classes' own. A dataset whose class cannot take a subclass (a builtin
    such as a list) is not probed: watcher/own_iterators.py checks it before.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from dataloader_tuner.instrument import probes
from dataloader_tuner.instrument.first_fetch import first_fetch_probe, rng_state
from dataloader_tuner.instrument.probes import TimedMapDataset, timed_items
from dataloader_tuner.instrument.stacks import OfferingStack

_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class written in Python, whose instances may move
_timed_classes: dict[tuple[type, tuple[str, ...]], type] = {}
_made_from: dict[type, type] = {}  # a timed class -> the class it was made from
_fetching: TimedMapDataset | None = None  # this worker's timed fetch, once TimedFetchInit ran
# (the dataset and its random generators before this worker's first item, until it is pulled)
_first_item: tuple[Any, dict[str, str]] | None = None


def can_time_fetch(dataset: Any) -> bool:
    """Whether a worker's copy of ``dataset`` can take the timed class (see the NOTE)."""
    cls = type(dataset)
    return bool(cls.__flags__ & _HEAP_TYPE) and not cls.__itemsize__


def timed_class(cls: type, methods: dict[str, Any]) -> type:
    """``cls`` with ``methods`` timed, named as ``cls`` is (made once per class and methods)."""
    key = (cls, tuple(sorted(methods)))
    made = _timed_classes.get(key)
    if made is None:
        made = type(cls.__name__, (cls,), {**methods, "__slots__": (),
                                           "__qualname__": cls.__qualname__,
                                           "__module__": cls.__module__})
        _timed_classes[key], _made_from[made] = made, cls
    return made


def _users(cls: type) -> Any:  # (a class whose methods are the user's: typed loosely)
    """The user's class under the timed ones made from it."""
    while cls in _made_from:
        cls = _made_from[cls]
    return cls


def _timed_getitems(self: Any, indices: list) -> list:
    return _fetching.__getitems__(indices)  # type: ignore[union-attr]  # set before any fetch


def _timed_iter(self: Any) -> Any:
    """The user's ``__iter__``, its items timed (see the NOTE)."""
    global _first_item
    if probes._timer.first_fetch_here():
        _first_item = (self, rng_state(self))
    iterator = _users(type(self)).__iter__(self)
    if getattr(type(iterator), "__next__", None) is _timed_next:
        return iterator  # (the dataset as its own iterator, timed at an earlier epoch)
    if iterator is self or (hasattr(type(iterator), "__next__")
                            and can_time_fetch(iterator)):
        iterator.__class__ = timed_class(type(iterator), {"__next__": _timed_next})
        return iterator
    first, _first_item = _first_item, None
    return timed_items(iter(iterator), self, first[1] if first else None)


def _timed_next(self: Any) -> Any:
    """The user's ``__next__``, timed as probes.timed_items times an item."""
    global _first_item
    timer = probes._timer
    timed = timer.made % timer.timed_every == 0
    start = timer.begin() if timed else 0.0
    item = _users(type(self)).__next__(self)
    if timed:
        timer.add(start, probes.clock())
    if _first_item is not None:
        source, before = _first_item
        timer.probe, _first_item = first_fetch_probe(before, rng_state(source)), None
    return item


class TimedFetchInit(OfferingStack):
    """The worker_init_fn set while a subclass makes an iterator: the worker's dataset gets its
    timed class (a map dataset's fetch through a TimedMapDataset, an iterable's items timed as
    pulled) before its first batch; then its stack is offered and the user's own
    worker_init_fn runs, as OfferingStack does."""

    def __call__(self, worker_id: int) -> None:
        global _fetching
        info = get_worker_info()
        if info is not None and can_time_fetch(info.dataset):
            dataset = info.dataset
            if isinstance(dataset, IterableDataset):
                dataset.__class__ = timed_class(type(dataset), {"__iter__": _timed_iter})
            else:
                _fetching = TimedMapDataset(dataset)  # (its fetch read before the class changes)
                dataset.__class__ = timed_class(type(dataset), {"__getitems__": _timed_getitems})
        super().__call__(worker_id)
