"""A worker_init_fn that runs yours, then one thing of the tool's: the companions a tune
recommends (heap.KeepFreedMemory, threads.LimitThreads) are this one wrapper, and how to find
one inside a chain of wrappers (the probes' own wrap the user's too)."""

from __future__ import annotations

from typing import Any, Callable


class AfterYourInit:
    """Runs ``init_fn`` (yours, if any), then ``then()``. Each companion is a class of its own,
    not a closure, so spawn workers can unpickle it by name."""

    def __init__(self, init_fn: Callable[[int], Any] | None = None) -> None:
        self.init_fn = init_fn

    def __call__(self, worker_id: int) -> None:
        if self.init_fn is not None:  # first: what it sets (torch's threads) is then overruled
            self.init_fn(worker_id)
        self.then()

    def then(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        inner = getattr(self.init_fn, "__qualname__", None) or (
            type(self.init_fn).__name__ if self.init_fn is not None else "")
        return f"{type(self).__name__}({inner})"


def wraps_a(init_fn: Any, kind: type) -> bool:
    """Whether a worker_init_fn is a ``kind``, or wraps one (through each wrapper's
    ``init_fn``: the companions', the probes')."""
    while init_fn is not None:
        if isinstance(init_fn, kind):
            return True
        init_fn = getattr(init_fn, "init_fn", None)
    return False
