"""The dataset card: what the user sees of their dataset (class, length, a sample's structure
and size), in the `ready` event and on the page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import itertools

from dataloader_tuner.instrument.tensors import payload_bytes
from dataloader_tuner.record.cards import DatasetCard, dataset_length, type_name
from dataloader_tuner.child.target import ResolvedTarget


def structure(value: Any, depth: int = 0) -> Any:
    """A JSON-safe outline of a sample: ``Tensor[float32](3, 32, 32)``, dicts and lists of those."""
    if depth > 4:
        return "..."
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        kind = type(value).__name__
        dtype = str(value.dtype).replace("torch.", "")
        return f"{kind}[{dtype}]{tuple(value.shape)}"
    if isinstance(value, Mapping):
        return {str(k): structure(v, depth + 1) for k, v in list(value.items())[:20]}
    if isinstance(value, (list, tuple)):
        items = [structure(v, depth + 1) for v in value[:10]]
        return items + ["..."] if len(value) > 10 else items
    if isinstance(value, (int, float, bool, str)) or value is None:
        return type(value).__name__
    return type(value).__qualname__


def dataset_card(resolved: ResolvedTarget, with_sample: bool = True) -> DatasetCard:
    dataset = resolved.dataset
    length = dataset_length(dataset)
    sample: Any = _NONE
    sample_error = None
    if with_sample:
        try:
            sample = _first_sample(resolved, length)
        except Exception as exc:  # noqa: BLE001
            if not resolved.is_iterable:
                raise  # sample 0 of a map-style dataset failing is the run's error
            # Some streams only work inside workers (they shard by get_worker_info()).
            sample_error = f"{type(exc).__name__}: {exc}"
    return DatasetCard(
        target=resolved.target,
        found_as=resolved.found_as,
        class_name=type_name(dataset),
        kind="iterable" if resolved.is_iterable else "map",
        length=length,
        defines_batch_size=resolved.defines_batch_size,
        module_batch_size=resolved.batch_size if resolved.defines_batch_size else None,
        has_collate_fn=resolved.collate_fn is not None,
        has_sampler=resolved.sampler is not None or resolved.batch_sampler is not None,
        has_train_step=resolved.train_step is not None,
        has_dataloader_kwargs=bool(resolved.dataloader_kwargs),
        sample=None if sample is _NONE else structure(sample),
        sample_bytes=None if sample is _NONE else payload_bytes(sample),
        sample_error=sample_error,
    )


_NONE = object()


def _first_sample(resolved: ResolvedTarget, length: int | None) -> Any:
    """Sample 0 of a map-style dataset, or the first item an iterable yields (this runs in the
    engine's child process, so pulling one item cannot disturb the user's own process)."""
    if resolved.is_iterable:
        return next(itertools.islice(iter(resolved.dataset), 1), _NONE)
    return resolved.dataset[0] if length else _NONE
