"""Long-tailed labels stored class-sorted, as ``ImageFolder`` (or an iNaturalist / LVIS-style
export) lists them: 10 classes from 880 samples down to 40, a 22:1 ratio.

Why the shape matters: the user shuffles (``shuffle=True``), so every batch mixes classes and
nothing looks wrong per batch, yet the model sees class 0 22 times as often as class 9. The
labels are plain ints and ``.targets`` is exposed as ImageFolder does, so a tool can count
them from the batches (or read ``.targets``) and suggest a ``WeightedRandomSampler``.

Data: ``data.npz`` with float32 features [2930, 3, 8, 8] and int64 labels, class-sorted.
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

# round(880 * 22 ** (-c / 9)) for c in 0..9: a geometric tail, exactly 22:1 end to end
COUNTS = [880, 624, 443, 314, 223, 158, 112, 80, 56, 40]

batch_size = 32
dataloader_kwargs = {"shuffle": True}


def _build(folder: str) -> None:
    rng = np.random.default_rng(7)
    labels = np.repeat(np.arange(len(COUNTS)), COUNTS).astype(np.int64)  # class-sorted
    features = rng.normal(size=(len(labels), 3, 8, 8)).astype(np.float32)
    features += labels[:, None, None, None].astype(np.float32) / 10
    np.savez(os.path.join(folder, "data.npz"), features=features, labels=labels)


class LongTail(Dataset):
    def __init__(self, root: str) -> None:
        with np.load(os.path.join(root, "data.npz")) as data:
            self.features = torch.from_numpy(data["features"])
            self.targets = data["labels"].tolist()  # list of int, like ImageFolder.targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.features[index], self.targets[index]


def make_dataset(root: str | None = None) -> LongTail:
    return LongTail(root or fixture_dir("long_tail-v1", _build))


EXPECTED = {
    "samples_per_batch": 32,
    "diagnostics_present": ["skewed_labels"],
    "diagnostics_absent": ["worker_memory_growth"],
    "label_counts": dict(enumerate(COUNTS)),  # exact counts in the dataset
    "label_ratio": COUNTS[0] / COUNTS[-1],  # 22.0: most common / least common
}
