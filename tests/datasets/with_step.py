import time

import torch
from torch.utils.data import Dataset

batch_size = 4
steps = []


class Items(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, index):
        return torch.tensor([index])


def make_dataset():
    return Items()


def train_step(batch):
    time.sleep(0.002)
