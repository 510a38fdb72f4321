import torch
from torch.utils.data import IterableDataset, get_worker_info

batch_size = 5


class Stream(IterableDataset):
    def __init__(self, length=200):
        self.length = length

    def __iter__(self):
        info = get_worker_info()
        n, i = (info.num_workers, info.id) if info else (1, 0)
        for index in range(i, self.length, n):
            yield torch.tensor([float(index)])


def get_dataset():
    return Stream()
