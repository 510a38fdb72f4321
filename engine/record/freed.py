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

    A worker's batch is followed whatever its size: each of its tensors is a mapping of shared
    memory, and unmapping one costs ~15-50 us however small (8 x 4 floats and their labels, 2
    workers: the loop's clock read ~90 us a batch more than the tool's, ~40 us after). A
    wrapper asking one batch ahead (accelerate's shard) hands the loop each batch a wait after
    the tool handed it on, and the loop lets go of it a wait later too: there it is held one
    wait longer (accelerate's loop: 0.957 of its own clock, 0.967 after; bench/trainer_clocks.py).
"""

from __future__ import annotations

import weakref
from typing import Any

# a batch made in the main process under a MiB is freed in well under 0.1 ms: not followed
FREED_BYTES = 1 << 20
MAX_FOLLOWED = 8  # tensors of a batch followed, at most (the first found: its images, its ids)


def worth_following(meta: Any) -> bool:
    """Whether the free of the batch ``meta`` came with costs the loop's clock would see: a
    worker's (each tensor in shared memory, its unmap ~15-50 us whatever its size), or one
    of FREED_BYTES or more (its size read where its making was timed)."""
    if meta[0] >= 0:  # (worker_id, ...: BatchMeta or an untimed batch's tuple)
        return True
    nbytes = meta[7] if meta.__class__ is not tuple else None
    return nbytes is not None and nbytes >= FREED_BYTES


def watch(batch: Any) -> tuple[weakref.ref, ...]:
    """Weak references to the tensors of a batch worth following (``worth_following``; the
    caller asks first: see the NOTE)."""
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
