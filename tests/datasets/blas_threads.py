"""Samples made with numpy's linear algebra, as feature pipelines, augmentations by matrix
(colour transforms, warps) and spectrograms do: a few 128x128 matmuls each. numpy's OpenBLAS
starts one thread per core in every worker; DataLoader limits torch's pool, not this one
(NOTE [ Threads per worker ], instrument/threads.py)."""

import numpy as np
import torch
from torch.utils.data import Dataset

batch_size = 8
SIDE, ROUNDS = 128, 3


class Whitened(Dataset):
    def __len__(self):
        return 2000

    def __getitem__(self, index):
        x = np.random.default_rng(index).standard_normal((SIDE, SIDE))
        for _ in range(ROUNDS):
            x = x @ x.T / SIDE
        return torch.from_numpy(x[:4].astype(np.float32))


dataset = Whitened()
