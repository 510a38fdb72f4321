"""A dataset holding a lambda: fine with fork, fails with spawn/forkserver workers."""

import torch
from torch.utils.data import Dataset

batch_size = 2


class WithLambda(Dataset):
    def __init__(self):
        self.transform = lambda x: x * 2

    def __len__(self):
        return 64

    def __getitem__(self, index):
        return self.transform(torch.zeros(2))


dataset = WithLambda()
