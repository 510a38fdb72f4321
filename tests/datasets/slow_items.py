"""Each sample takes 10 s: a stop must not wait for it."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 1


class Slow(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, index):
        if index == 0:
            return torch.zeros(2)  # sample 0 is read up front to describe the dataset
        time.sleep(10)
        return torch.zeros(2)


dataset = Slow()
