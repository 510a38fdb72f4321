"""A few samples take seconds, the rest a millisecond, as a corrupt or remote file would: the
batch holding sample 40 takes 1.6 s each epoch while the others take a few milliseconds."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 4
SLOW = {40: 1.6}  # sample index -> seconds it takes


class SlowOnAFew(Dataset):
    def __len__(self):
        return 200

    def __getitem__(self, index):
        time.sleep(SLOW.get(index, 0.001))
        return torch.full((8,), float(index))


dataset = SlowOnAFew()
