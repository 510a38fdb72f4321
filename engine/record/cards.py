"""What a run learns before measuring, sent in the Ready event, kept in the run history and
shown on the page: the user's dataset (the dataset card, built in the engine's child by
child/dataset_card.py) and what consumes its batches; a dataset's length and class name as
any part says them. JSON keys as they have always been
written (``class`` for the class name)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DatasetCard:
    target: str  # as the user gave it: path.py[:attr] or pkg.module[:attr]
    found_as: str  # how the dataset was found there ("make_dataset()", "dataset", ...)
    class_name: str  # the dataset's class, qualified
    kind: str  # "map" or "iterable"
    length: int | None  # None: no len() (an IterableDataset)
    defines_batch_size: bool  # the module sets batch_size itself (None: it batches itself)
    module_batch_size: int | None
    has_collate_fn: bool
    has_sampler: bool  # a sampler or batch sampler of the module's own
    has_train_step: bool
    has_dataloader_kwargs: bool
    sample: Any = None  # a JSON-safe outline of sample 0 (or an iterable's first item)
    sample_bytes: int | None = None  # its size as it would cross from a worker
    sample_error: str | None = None  # why there is no sample (a stream that needs workers)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["class"] = doc.pop("class_name")
        if doc["sample_error"] is None:
            del doc["sample_error"]
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "DatasetCard":
        """Also a card an older version wrote (a watched run's lacked most fields)."""
        get = doc.get
        return cls(
            target=get("target", ""), found_as=get("found_as", ""),
            class_name=get("class", "?"), kind=get("kind", "map"), length=get("length"),
            defines_batch_size=bool(get("defines_batch_size")),
            module_batch_size=get("module_batch_size"),
            has_collate_fn=bool(get("has_collate_fn")), has_sampler=bool(get("has_sampler")),
            has_train_step=bool(get("has_train_step")),
            has_dataloader_kwargs=bool(get("has_dataloader_kwargs")),
            sample=get("sample"), sample_bytes=get("sample_bytes"),
            sample_error=get("sample_error"))


@dataclass(frozen=True)
class Consumer:
    """What consumes each batch: the module's ``train_step``, a simulated step, nothing, or a
    watched job's own training loop (``framework``: the trainer that runs it, if one does).

    A simulated step sleeps (off the CPU, as a GPU step leaves the CPU free) or, on a GPU,
    keeps the GPU busy for ``step_ms``.
    """

    kind: str = "none"  # "train_step" | "simulated" | "none" | "training_loop"
    step_ms: float = 0.0
    framework: str | None = None

    @classmethod
    def choose(cls, step_ms: float | None, has_train_step: bool) -> "Consumer":
        """--step-ms wins; else the module's train_step; else no consumer."""
        if step_ms is not None:
            return cls("simulated", float(step_ms)) if step_ms > 0 else cls("none")
        return cls("train_step") if has_train_step else cls("none")

    @classmethod
    def training_loop(cls, framework: str | None) -> "Consumer":
        return cls("training_loop", framework=framework)

    @property
    def steps(self) -> bool:
        """Something consumes the batches (the loop's idle share means something)."""
        return self.kind != "none"

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind,
                               "step_ms": self.step_ms if self.kind == "simulated" else None}
        if self.kind == "training_loop":
            doc["framework"] = self.framework
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Consumer":
        return cls(doc.get("kind") or "none", float(doc.get("step_ms") or 0.0),
                   doc.get("framework"))


# What a card says of any dataset, in the engine's child and in a watched job alike


def dataset_length(dataset: Any) -> int | None:
    """``len(dataset)``, or None for one without a length (an IterableDataset's, usually)."""
    try:
        return len(dataset)
    except TypeError:
        return None


def type_name(obj: Any) -> str:
    """``datasets.arrow_dataset.Dataset`` rather than a bare ``Dataset``: several libraries
    name their class Dataset, and a message naming only that word says nothing."""
    cls = obj if isinstance(obj, type) else type(obj)
    module = getattr(cls, "__module__", "") or ""
    return cls.__qualname__ if module in ("builtins", "") else f"{module}.{cls.__qualname__}"
