"""95% of the samples are class 0."""

import torch
from torch.utils.data import Dataset

batch_size = 16


class Skewed(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, index):
        return torch.zeros(4), 1 if index % 20 == 0 else 0


dataset = Skewed()
