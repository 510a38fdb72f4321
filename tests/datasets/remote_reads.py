"""Each sample waits 5 ms for its bytes (a remote object store's round trip) and uses almost no
CPU: threads in each worker overlap the waits (child/io_threads.py)."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 8
LATENCY_S = 0.005


class RemoteReads(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int):
        time.sleep(LATENCY_S)
        return torch.full((64,), float(index)), index % 10


def make_dataset() -> Dataset:
    return RemoteReads()
