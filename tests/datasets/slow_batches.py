"""Batches of 8 samples that each wait 10 ms (a slow store): ~80 ms a batch in the main process,
almost no CPU, so the cost model sends the search to many workers. For the tune's plan and its
time limit."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 8


class SlowStore(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.full((4,), float(index))


dataset = SlowStore()
