"""A map-style dataset each of whose items works ~60 us of pure Python, held in memory: a
batch of 8 is ~0.5 ms of CPU and nothing else. It reads no clock (a read of the thread's CPU
clock updates the process's: NOTE [ A fetch's CPU, read finely ] would not show)."""

import torch
from torch.utils.data import Dataset

WORK = 1500  # loop turns an item: ~60 us on the 2-core machine
batch_size = 8


class FastSpins(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> torch.Tensor:
        total = sum(i * i for i in range(WORK))
        return torch.tensor([index + total % 2], dtype=torch.float32)


dataset = FastSpins()
