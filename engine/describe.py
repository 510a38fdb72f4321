"""Describe a dataset for the user: class, length, and a sample's structure and size."""

from __future__ import annotations

from typing import Any

from .probes import nbytes_of
from .target import ResolvedTarget


def structure(value: Any, depth: int = 0) -> Any:
    """A JSON-safe outline of a sample: ``Tensor[float32](3, 32, 32)``, dicts and lists of those."""
    if depth > 4:
        return "..."
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        kind = type(value).__name__
        dtype = str(value.dtype).replace("torch.", "")
        return f"{kind}[{dtype}]{tuple(value.shape)}"
    if isinstance(value, dict):
        return {str(k): structure(v, depth + 1) for k, v in list(value.items())[:20]}
    if isinstance(value, (list, tuple)):
        items = [structure(v, depth + 1) for v in value[:10]]
        return items + ["..."] if len(value) > 10 else items
    if isinstance(value, (int, float, bool, str)) or value is None:
        return type(value).__name__
    return type(value).__qualname__


def describe(resolved: ResolvedTarget, with_sample: bool = True) -> dict:
    dataset = resolved.dataset
    try:
        length = len(dataset)
    except TypeError:
        length = None
    info = {
        "target": resolved.target,
        "found_as": resolved.found_as,
        "class": type(dataset).__qualname__,
        "kind": "iterable" if resolved.is_iterable else "map",
        "length": length,
        "module_batch_size": resolved.batch_size,
        "has_collate_fn": resolved.collate_fn is not None,
        "has_sampler": resolved.sampler is not None,
        "has_train_step": resolved.train_step is not None,
        "sample": None,
        "sample_bytes": None,
    }
    # Only map-style samples are read up front: pulling from an iterable may have side effects.
    if with_sample and not resolved.is_iterable and length:
        sample = dataset[0]
        info["sample"] = structure(sample)
        info["sample_bytes"] = nbytes_of(sample)
    return info
