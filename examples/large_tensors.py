"""Large image-like tensors: 3x224x224 float32 samples (~600 KB each) made with vectorised
torch ops. Bytes dominate: shared-memory transport and, on a GPU, the host-to-device copy
(where pin_memory matters) are the costs to watch.
"""

import torch
from torch.utils.data import Dataset

batch_size = 16


class SyntheticImageDataset(Dataset):
    def __init__(self, length: int = 2048, size: int = 224) -> None:
        self.length, self.size = length, size

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        image = torch.rand(3, self.size, self.size, generator=generator)
        image = (image - 0.5) / 0.25  # a normalisation pass, like a transform pipeline
        return image, index % 1000


def make_dataset() -> Dataset:
    return SyntheticImageDataset()
