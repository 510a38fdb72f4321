"""A map-style table that does not subclass torch's Dataset (as Arrow-backed tables do), with a
collate returning a Mapping that is not a dict, and a sampler built from the dataset."""

import collections

import torch
from torch.utils.data import RandomSampler

batch_size = 8


class Table:
    def __init__(self, rows=40):
        self.rows = rows

    def __len__(self):
        return self.rows

    def __getitem__(self, i):
        return {"ids": [i] * (1 + i % 5), "label": i % 3}

    def __getitems__(self, indices):
        return [self[i] for i in indices]


class Encoding(collections.UserDict):
    pass


def collate_fn(samples):
    width = max(len(s["ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.int64)
    for row, s in enumerate(samples):
        ids[row, : len(s["ids"])] = torch.tensor(s["ids"])
    return Encoding(input_ids=ids, labels=torch.tensor([s["label"] for s in samples]))


def make_sampler(dataset):
    return RandomSampler(dataset, generator=torch.Generator().manual_seed(0))


def make_dataset(rows=40):
    return Table(rows)
