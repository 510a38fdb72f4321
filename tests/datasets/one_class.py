import torch
from torch.utils.data import Dataset


class OnlyOne(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([i])
