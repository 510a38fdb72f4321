"""An IterableDataset (a stream, e.g. reading shards): each worker reads its own share."""

import math
import time

import torch
from torch.utils.data import IterableDataset, get_worker_info

batch_size = 32


class ShardStream(IterableDataset):
    def __init__(self, length: int = 20_000, latency_s: float = 0.0005) -> None:
        self.length, self.latency_s = length, latency_s

    def __iter__(self):
        info = get_worker_info()
        per_worker = math.ceil(self.length / (info.num_workers if info else 1))
        start = (info.id if info else 0) * per_worker
        for index in range(start, min(start + per_worker, self.length)):
            time.sleep(self.latency_s)
            yield torch.full((32,), float(index)), index % 5


def make_dataset() -> IterableDataset:
    return ShardStream()
