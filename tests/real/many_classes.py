"""1000 evenly used classes, 8 samples each (ImageNet-1k's class count, a tiny per-class
sample): 8000 samples, ``shuffle=True``.

Why the shape matters: the labels are perfectly balanced, but a short run only sees a few
samples of each class, so counted per class they look uneven by chance (some classes seen
once, others five times, many not at all). A skew rule that compares raw counts without
regard to how many samples it has per class will flag a balanced dataset here.

Data: ``data.npz`` with float32 features [8000, 16] and int64 labels (class-sorted).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.utils.data import Dataset

try:
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    from _data import fixture_dir

NUM_CLASSES = 1000
PER_CLASS = 8

batch_size = 64
dataloader_kwargs = {"shuffle": True}


def _build(folder: str) -> None:
    rng = np.random.default_rng(8)
    labels = np.repeat(np.arange(NUM_CLASSES), PER_CLASS).astype(np.int64)
    features = rng.normal(size=(len(labels), 16)).astype(np.float32)
    np.savez(os.path.join(folder, "data.npz"), features=features, labels=labels)


class ManyClasses(Dataset):
    def __init__(self, root: str) -> None:
        with np.load(os.path.join(root, "data.npz")) as data:
            self.features = torch.from_numpy(data["features"])
            self.targets = data["labels"].tolist()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.features[index], self.targets[index]


def make_dataset(root: str | None = None) -> ManyClasses:
    return ManyClasses(root or fixture_dir("many_classes-v1", _build))


EXPECTED = {
    "samples_per_batch": 64,
    "diagnostics_present": [],
    "diagnostics_absent": ["skewed_labels", "worker_memory_growth"],
    "label_counts": {c: PER_CLASS for c in range(NUM_CLASSES)},
    "label_ratio": 1.0,
}
