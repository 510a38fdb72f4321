"""A dataset that creates its own random generator in __init__: every worker gets a copy."""

import numpy as np
import torch
from torch.utils.data import Dataset

batch_size = 4


class Augmented(Dataset):
    def __init__(self):
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return 4096

    def __getitem__(self, index):
        noise = self.rng.normal(size=8).astype("float32")
        return torch.from_numpy(noise), index % 2


dataset = Augmented()
