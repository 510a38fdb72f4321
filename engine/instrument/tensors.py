"""Walking a batch's structure: the tensors in it, and the batch moved to a device with its
structure kept (what the GPU timers and ``loader.to`` share)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


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
