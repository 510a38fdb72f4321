"""Tiny in-memory samples: indexing a tensor already in RAM costs microseconds, so moving
batches between processes costs more than making them. Fastest with num_workers=0.
"""

import torch
from torch.utils.data import Dataset

batch_size = 64


class TinyTensorDataset(Dataset):
    def __init__(self, length: int = 50_000) -> None:
        generator = torch.Generator().manual_seed(0)
        self.features = torch.randn(length, 16, generator=generator)
        self.labels = torch.randint(0, 10, (length,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.features[index], self.labels[index]


def make_dataset() -> Dataset:
    return TinyTensorDataset()
