"""Walking a batch's structure: its samples and bytes (what the probes count per batch), the
tensors in it, and the batch moved to a device with its structure kept (what the GPU timers
and ``loader.to`` share)."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, strided


def tensors_of(batch: Any) -> list:
    """The tensors in a batch (tuples, lists, dicts, nested), in order."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for value in batch.values() for t in tensors_of(value)]
    if isinstance(batch, (list, tuple)):
        return [t for value in batch for t in tensors_of(value)]
    return []


def moved(batch: Any, device: Any, non_blocking: bool) -> Any:
    """The batch with every tensor on ``device``, its structure kept: namedtuples, any mapping
    (a UserDict such as HuggingFace's BatchEncoding, a defaultdict), and objects that move
    themselves with ``.to`` (PyG's Data, batch dataclasses)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        copy = batch.copy() if hasattr(batch, "copy") else dict(batch)
        for key, value in batch.items():
            copy[key] = moved(value, device, non_blocking)
        return copy
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(moved(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(moved(v, device, non_blocking) for v in batch)
    to = getattr(batch, "to", None)
    if callable(to) and not isinstance(batch, (str, bytes)):
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:  # a .to without non_blocking
            return to(device)
    return batch


def sizes_of(batch: Any, samples: int | None = None) -> tuple[int, int]:
    """(samples, bytes) of a collated batch. ``samples`` is the number of items the batch was
    made of when DataLoader batched them (exact); without auto-batching (``batch_size=None``)
    it is read off the batch by ``samples_in``. A tuple or list of tensors, the usual
    (inputs, labels) batch, takes a fast path."""
    if type(batch) in (tuple, list) and batch:
        total = 0
        for value in batch:
            if type(value) is not Tensor or value.layout is not strided:
                break
            total += value.nbytes
        else:
            if samples is None:
                first = batch[0]
                samples = first.shape[0] if first.ndim > 0 else len(batch)
            return samples, total
    return (samples if samples is not None else samples_in(batch)), payload_bytes(batch)


# The walk over a batch's structure is bounded, so measuring costs the same per batch whatever
# the batch holds (a detection batch can hold 100k polygon floats in Python lists): at most
# WALK_BUDGET objects are visited, and of a long list only WALK_LIST_SAMPLE items, scaled up.
WALK_BUDGET = 256
WALK_LIST_SAMPLE = 16
PY_SCALAR_BYTES = 8  # an int or float as it crosses the process boundary (pickled, roughly)


def payload_bytes(value: Any) -> int:
    """Bytes a batch or sample carries: tensor and array data, bytes and str, and 8 per Python
    number, found by a bounded walk (long lists are sampled and scaled: an estimate)."""
    budget = [WALK_BUDGET]
    return int(_walk_bytes(value, budget))


def _walk_bytes(value: Any, budget: list[int]) -> float:
    budget[0] -= 1
    if budget[0] < 0:
        return 0.0
    if isinstance(value, Tensor):
        return value.element_size() * value.nelement() if value.layout is strided else 0.0
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, (int, float, bool)) or value is None:
        return PY_SCALAR_BYTES if value is not None else 0.0
    if hasattr(value, "nbytes") and hasattr(value, "shape"):
        return float(value.nbytes)
    items = _children(value)
    if items is None:
        return 0.0
    if len(items) <= WALK_LIST_SAMPLE:
        return sum(_walk_bytes(v, budget) for v in items)
    step = len(items) / WALK_LIST_SAMPLE
    sampled = [items[int(i * step)] for i in range(WALK_LIST_SAMPLE)]
    return sum(_walk_bytes(v, budget) for v in sampled) * step


def _children(value: Any) -> list | None:
    """The parts of a container: sequences, any Mapping (UserDict, BatchEncoding), dataclass-
    or attribute-style batch objects."""
    if isinstance(value, (list, tuple)):
        return value if isinstance(value, list) else list(value)
    if isinstance(value, Mapping):
        return list(value.values())
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return [getattr(value, name, None) for name in fields]
    if callable(value):
        return None
    # What it refers to, not its __dict__: reading that slows the object's attribute loads for
    # good (first_fetch.rng_attributes), and a batch made in the main process is the job's.
    parts = [part for part in gc.get_referents(value) if not isinstance(part, type)]
    return parts[:WALK_LIST_SAMPLE] or None


SAMPLES_RULE = ("batch_size=None: each item is a batch; its samples are the leading dimension of "
                "the first tensor or array in it (else the length of a list of samples, else 1)")


def samples_in(batch: Any) -> int:
    """Samples in a batch the dataset made itself (``batch_size=None``): see SAMPLES_RULE."""
    found = _first_array(batch)
    if found is not None and getattr(found, "ndim", 0) > 0:
        return int(found.shape[0])
    if isinstance(batch, (list, tuple)) and batch and not isinstance(batch[0], (int, float)):
        return len(batch)
    return 1


def _first_array(batch: Any) -> Any:
    """The first tensor or array, level by level (a WebDataset batch is (keys, images, labels):
    the images are found before the walk spends itself on 256 key strings). Bounded like the
    byte walk: WALK_BUDGET containers, WALK_LIST_SAMPLE items of each."""
    level, budget = [batch], WALK_BUDGET
    while level and budget > 0:
        deeper = []
        for value in level:
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                return value
            if isinstance(value, (str, bytes, bytearray, int, float)) or value is None:
                continue
            budget -= 1
            items = _children(value)
            if items:
                deeper.extend(items[:WALK_LIST_SAMPLE])
            if budget <= 0:
                break
        level = deeper
    return None
