"""CPU-bound Python work per sample (think: decoding and augmenting in pure Python).

Each sample spends ~2 ms of CPU in the interpreter, so throughput scales with the CPU cores
the workers can use and stops near the core count.
"""

import torch
from torch.utils.data import Dataset

batch_size = 16


class CpuBoundDataset(Dataset):
    def __init__(self, length: int = 4096, work: int = 6000) -> None:
        self.length, self.work = length, work

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        acc = index
        for i in range(self.work):  # deliberate pure-Python work, holds the GIL
            acc = (acc * 1103515245 + 12345 + i) & 0x7FFFFFFF
        features = torch.full((64,), float(acc % 1000) / 1000.0)
        return features, index % 10


def make_dataset() -> Dataset:
    return CpuBoundDataset()
