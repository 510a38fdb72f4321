"""Latency-bound samples: each one waits ~20 ms (think: remote object storage) and uses
almost no CPU. Workers overlap the waits, so throughput keeps scaling far past the core count.
"""

import time

import torch
from torch.utils.data import Dataset

batch_size = 8


class RemoteStorageDataset(Dataset):
    def __init__(self, length: int = 100_000, latency_s: float = 0.02) -> None:
        self.length, self.latency_s = length, latency_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        time.sleep(self.latency_s)  # a network round trip: the CPU is idle meanwhile
        return torch.randn(128), index % 100


def make_dataset() -> Dataset:
    return RemoteStorageDataset()
