"""Batches of 8 samples that each wait 125 ms (a slow remote store): ~1 s a batch in the main
process and almost no CPU, so more workers pay up to the most allowed. A tune's whole plan of
it takes minutes; for the time a tune aims at (NOTE [ A tune's aim ], engine/tune/plan.py)."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 8


class SecondBatches(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        time.sleep(0.125)
        return torch.full((4,), float(index))


dataset = SecondBatches()
