"""Sample 6 blocks forever (a lock or a network read that never returns)."""

import threading

import torch
from torch.utils.data import Dataset

batch_size = 2
_never = threading.Event()


class Stuck(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, index):
        if index == 6:
            _never.wait()
        return torch.zeros(2)


dataset = Stuck()
