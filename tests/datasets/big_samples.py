"""Samples of 4 MB (a float32 image of 1024 x 1024): a batch of 4 is 16 MB, so 2 workers with
prefetch_factor 2 keep 64 MB in flight through /dev/shm, a container's whole default."""

import torch
from torch.utils.data import Dataset

batch_size = 4


class BigSamples(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int):
        return torch.full((1024, 1024), float(index)), index % 2


dataset = BigSamples()
