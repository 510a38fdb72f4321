"""Each worker starts a thread pool of 8 threads (as OpenMP/OpenCV/BLAS do per core)."""

from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils.data import Dataset

batch_size = 4
_pool = None


def _work(i):
    return sum(range(6000 + i % 7))


class Pooled(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        global _pool
        if _pool is None:  # created in each worker on first use
            _pool = ThreadPoolExecutor(max_workers=8)
        list(_pool.map(_work, range(16)))
        return torch.zeros(2)


dataset = Pooled()
