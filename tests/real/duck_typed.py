"""A Hugging Face ``datasets.Dataset``-like table with a ``transformers``-like padding collate.

Why the shape matters:
- the dataset does NOT subclass ``torch.utils.data.Dataset``: it only has ``__len__``,
  ``__getitem__`` and ``__getitems__`` (which the DataLoader's fetcher calls with a whole
  batch of indices, as it does for HF datasets). ``isinstance(ds, Dataset)`` is False.
- rows are dicts of a variable-length ``input_ids`` list and an int ``label``, stored like
  an Arrow list column (one flat int32 buffer plus offsets), converted to Python per row.
- the collate (``DataCollatorWithPadding``) pads to the longest row and returns a
  ``BatchEncoding``, a ``collections.UserDict`` subclass: a Mapping, but not a ``dict``.

Data: ``table.npz`` with 4000 rows of 8..128 token ids (vocabulary 30522) and 2 labels.
"""

from __future__ import annotations

import os
from collections import UserDict

import numpy as np
import torch

try:
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    from _data import fixture_dir

NUM_ROWS = 4000
VOCAB = 30522
PAD_ID = 0

batch_size = 32
dataloader_kwargs = {"shuffle": True}


def _build(folder: str) -> None:
    rng = np.random.default_rng(9)
    lengths = rng.integers(8, 129, size=NUM_ROWS)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(1, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    labels = (np.arange(NUM_ROWS) % 2).astype(np.int64)
    np.savez(os.path.join(folder, "table.npz"), tokens=tokens, offsets=offsets, labels=labels)


class ArrowLikeTable:
    """Map-style by duck typing only: ``__len__``, ``__getitem__``, ``__getitems__``."""

    def __init__(self, root: str) -> None:
        with np.load(os.path.join(root, "table.npz")) as data:
            self.tokens, self.offsets = data["tokens"], data["offsets"]
            self.labels = data["labels"]
        self.column_names = ["input_ids", "label"]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        index = int(index)
        start, end = self.offsets[index], self.offsets[index + 1]
        return {"input_ids": self.tokens[start:end].tolist(), "label": int(self.labels[index])}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [self[i] for i in indices]


class BatchEncoding(UserDict):
    """Like ``transformers.BatchEncoding``: a UserDict with attribute access."""

    def __getattr__(self, name: str):
        if name != "data" and name in self.__dict__.get("data", {}):
            return self.data[name]
        raise AttributeError(name)

    def __getstate__(self) -> dict:
        return {"data": self.data}

    def __setstate__(self, state: dict) -> None:
        self.data = state["data"]


def collate_fn(rows: list[dict]) -> BatchEncoding:
    """Pad ``input_ids`` to the longest row: [B, T] ids and mask, [B] labels."""
    longest = max(len(row["input_ids"]) for row in rows)
    input_ids = torch.full((len(rows), longest), PAD_ID, dtype=torch.int64)
    attention_mask = torch.zeros((len(rows), longest), dtype=torch.int64)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[i, :n] = torch.tensor(row["input_ids"], dtype=torch.int64)
        attention_mask[i, :n] = 1
    labels = torch.tensor([row["label"] for row in rows], dtype=torch.int64)
    return BatchEncoding({"input_ids": input_ids, "attention_mask": attention_mask,
                          "labels": labels})


def make_dataset(root: str | None = None) -> ArrowLikeTable:
    return ArrowLikeTable(root or fixture_dir("duck_typed-v1", _build))


EXPECTED = {
    "samples_per_batch": 32,
    "diagnostics_present": [],
    "diagnostics_absent": ["skewed_labels", "worker_memory_growth"],
    "note": "not a torch Dataset subclass; the batch is a UserDict (Mapping, not dict)",
}
