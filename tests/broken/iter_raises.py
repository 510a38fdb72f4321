"""An IterableDataset whose __iter__ raises after a few items."""

import torch
from torch.utils.data import IterableDataset

batch_size = 2


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(5):
            yield torch.zeros(2)
        raise OSError("connection to the shard server was reset")


dataset = Stream()
