"""A dataset with a training step: the module's train_step stands in for the model.

Samples cost ~1 ms of CPU each (~16 ms per batch of 16). The step waits 12 ms per batch the way
a GPU step leaves the CPU free (the host waits on the device), plus a little CPU work. One
worker cannot keep up (16 ms per batch > 12 ms per step); two can. The question here is not top
loader speed but the fewest workers that keep the step fed.
"""

import time

import torch
from torch.utils.data import Dataset

batch_size = 16

_weights = torch.randn(256, 256)


class FeatureDataset(Dataset):
    def __init__(self, length: int = 8192, work: int = 3000) -> None:
        self.length, self.work = length, work

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        acc = index
        for i in range(self.work):  # ~1 ms of pure-Python work per sample
            acc = (acc * 1103515245 + 12345 + i) & 0x7FFFFFFF
        return torch.full((256,), float(acc % 97) / 97.0), acc % 2


def make_dataset() -> Dataset:
    return FeatureDataset()


def train_step(batch) -> None:
    """Stands in for forward + backward on a GPU: a little host work, then a wait."""
    features, _ = batch
    (features @ _weights).sum().item()
    time.sleep(0.012)
