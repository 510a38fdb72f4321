"""A worker crashes in native code (a null pointer read) on sample 9."""

import ctypes

import torch
from torch.utils.data import Dataset

batch_size = 2


class Crashes(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, index):
        if index == 9:
            ctypes.string_at(0)  # SIGSEGV, like a broken image decoder
        return torch.zeros(2)


dataset = Crashes()
