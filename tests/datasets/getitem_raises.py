import torch
from torch.utils.data import Dataset

batch_size = 2


class Broken(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, index):
        if index == 7:
            raise KeyError(f"label missing for sample {index}")
        return torch.zeros(2)


dataset = Broken()
