"""The batch a loop lets go of, freed inside its wait, where the loop's own clock has it.

NOTE [ A batch freed where the loop's clock has it ]

    A loop that takes its batch as ``for images, target in loader`` drops the batch before the
    new one when it binds the new one's tensors: after ``next()`` returned, before its own
    ``data_time`` reading (pytorch/examples' imagenet ``train()``). A worker's batch lives in
    shared memory, and unmapping it takes time: ~2.5 ms for 19 MB here (32 images of
    3x224x224 floats, 2 workers), which the loop's clock counts as waiting for data and the
    tool's wait did not: it read 0.026 of the loop against the loop's own 0.034, every batch
    ~2.4 ms short. A loop that drops the batch in its step instead (``images =
    images.to(device)`` on a GPU) has the free in its step, as the tool does.

    So where a batch is large enough for its free to matter (FREED_BYTES, from the bytes its
    worker measured), the tool keeps weak references to its tensors (``watch``); when the loop
    asks for the next batch, tensors still alive are ones the loop will drop after that batch
    is handed over: the tool holds them (``held``) and lets them go when the loop asks for the
    batch after, inside that wait (the loop's clock had the free in the batch before's: the
    sums agree, 0.0343 against the loop's 0.0344 above). A loop that freed its batch in its
    step leaves nothing alive and nothing is held. The cost: such a loop's batch lives one step
    longer (one batch more in memory, beside the prefetch_factor x num_workers in flight).
"""

from __future__ import annotations

import weakref
from typing import Any

FREED_BYTES = 1 << 20  # batches under a MiB are freed in well under 0.1 ms: not followed
MAX_FOLLOWED = 8  # tensors of a batch followed, at most (the first found: its images, its ids)


def watch(batch: Any) -> tuple[weakref.ref, ...]:
    """Weak references to the tensors of a batch of FREED_BYTES or more (the caller reads the
    size its worker measured, and calls only then: see the NOTE)."""
    return tuple(weakref.ref(tensor) for tensor in _tensors(batch, 2)[:MAX_FOLLOWED])


def held(followed: tuple[weakref.ref, ...]) -> tuple[Any, ...]:
    """The followed tensors the loop still holds, now holding them."""
    alive = tuple(ref() for ref in followed)
    return tuple(tensor for tensor in alive if tensor is not None)


def _tensors(value: Any, depth: int) -> list[Any]:
    if hasattr(value, "untyped_storage"):  # a tensor (torch not imported on this path)
        return [value]
    if depth == 0:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        found: list[Any] = []
        for item in value[:MAX_FOLLOWED]:
            found += _tensors(item, depth - 1)
        return found
    return []
