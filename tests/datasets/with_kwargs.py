"""A module that says how it trains today: its settings are the starting point everywhere."""

import torch
from torch.utils.data import Dataset

batch_size = 6
dataloader_kwargs = {"shuffle": True, "num_workers": 2, "drop_last": True,
                     "persistent_workers": True}


class Rows(Dataset):
    def __len__(self):
        return 60

    def __getitem__(self, i):
        return torch.full((3,), float(i)), i % 2


dataset = Rows()
