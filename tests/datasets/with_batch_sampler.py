"""Batches made by the module's own batch sampler, built from the dataset (bucketing-style)."""

import torch
from torch.utils.data import BatchSampler, Dataset, SequentialSampler


class Rows(Dataset):
    def __len__(self):
        return 50

    def __getitem__(self, i):
        return torch.full((2,), float(i))


def make_batch_sampler(dataset):
    return BatchSampler(SequentialSampler(dataset), batch_size=5, drop_last=False)


dataset = Rows()
