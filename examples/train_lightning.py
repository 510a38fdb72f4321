"""A Lightning training, its loaders watched by one callback. Run it, then open the dashboard's
Training jobs page:

    python examples/train_lightning.py               # or with --ddp: 2 processes (CPU, gloo)
    dataloader-tuner dashboard
"""

import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from dataloader_tuner.lightning import WatchLoaders


class Features(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        time.sleep(0.001)  # reading and decoding a sample
        return torch.randn(32), index % 4


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.model(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.model(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(Features(2048), batch_size=32, shuffle=True, num_workers=2)

    def val_dataloader(self):
        return DataLoader(Features(256), batch_size=32, num_workers=2)


if __name__ == "__main__":
    ddp = "--ddp" in sys.argv
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=2 if ddp else 1,
                        strategy="ddp" if ddp else "auto",
                        callbacks=[WatchLoaders()])  # the one line (tune=True tunes in place)
    trainer.fit(Classifier(), datamodule=Data())
