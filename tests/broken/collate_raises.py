"""The module's collate_fn raises."""

import torch
from torch.utils.data import Dataset

batch_size = 4


class Plain(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.zeros(2)


def collate_fn(samples):
    raise ValueError("collate_fn cannot handle this batch")


dataset = Plain()
