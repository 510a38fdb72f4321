"""A training loop on accelerate, its prepared loader watched in one line. Run it, then open
the dashboard's Training jobs page:

    python examples/train_accelerate.py          # or: accelerate launch examples/train_accelerate.py
    dataloader-tuner dashboard
"""

import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

from dataloader_tuner import watch


class Features(Dataset):
    def __len__(self) -> int:
        return 2048

    def __getitem__(self, index: int):
        time.sleep(0.001)  # reading and decoding a sample
        return torch.randn(32), index % 4


if __name__ == "__main__":
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    loader = DataLoader(Features(), batch_size=32, shuffle=True, num_workers=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loader = watch(loader, name="train")  # the one line: still accelerate's loader
    for epoch in range(3):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
