"""Each worker caches every sample it makes: its memory grows all run long."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 4


class Caching(Dataset):
    def __init__(self):
        self.cache = {}

    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        if index not in self.cache:
            time.sleep(0.005)
            self.cache[index] = torch.rand(64 * 1024 // 4)  # 64 KB per sample, kept forever
        return self.cache[index][:4]


dataset = Caching()
