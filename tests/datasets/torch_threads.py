"""Samples made with torch ops (a few 128x128 matmuls each) in workers whose worker_init_fn
raises torch's pool to one thread per core, as training scripts do to speed up CPU transforms.
DataLoader sets each worker to one thread before worker_init_fn runs; this undoes it
(NOTE [ Threads per worker ], instrument/threads.py). Spawned workers: a forked one that runs
torch's OpenMP pool after the parent ran it hangs in its first parallel region (GNU OpenMP is
not fork-safe), which is why DataLoader sets one thread."""

import os

import torch
from torch.utils.data import Dataset

batch_size = 8
dataloader_kwargs = {"num_workers": 2, "multiprocessing_context": "spawn"}
SIDE, ROUNDS = 128, 3


def worker_init_fn(worker_id):
    torch.set_num_threads(os.cpu_count() or 1)


class Transformed(Dataset):
    def __len__(self):
        return 2000

    def __getitem__(self, index):
        x = torch.randn(SIDE, SIDE, generator=torch.Generator().manual_seed(index),
                        dtype=torch.float64)
        for _ in range(ROUNDS):
            x = x @ x.T / SIDE
        return x[:4].float()


dataset = Transformed()
