"""A Lightning fit with its own clock on: ``Trainer(profiler="simple")`` times each fetch of
the training loop (``[_TrainingEpochLoop].train_dataloader_next``). 3 epochs of 8 batches of
16 image-sized samples (3 MB a batch, made by 2 workers), watched by the one callback. Prints,
as JSON, Lightning's time of each fetch and the tool's wait of each batch, by batch number, and
each epoch's ``iter()`` of Lightning's fetcher (where its workers start), which its profiler
leaves out: timed here around the fetcher's own ``__iter__``. argv: DB [--persistent]"""

import json
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from lightning.pytorch.loops import fetchers

from dataloader_tuner import RunStore
from dataloader_tuner.lightning import WatchLoaders

FETCH = "[_TrainingEpochLoop].train_dataloader_next"
BATCHES, EPOCHS = 8, 3


class Images(Dataset):
    def __len__(self) -> int:
        return 16 * BATCHES

    def __getitem__(self, index: int):
        time.sleep(0.001)  # reading and decoding, in short
        return torch.rand(3, 128, 128), index % 10


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 128 * 128, 10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(0.004)  # the rest of a step: the workers keep up, most fetches are short
        return torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Data(L.LightningDataModule):
    def __init__(self, persistent: bool) -> None:
        super().__init__()
        self.persistent = persistent

    def train_dataloader(self):
        return DataLoader(Images(), batch_size=16, shuffle=True, num_workers=2,
                          persistent_workers=self.persistent)


ITERS_S: list[float] = []  # each call of the training fetcher's iter(), in order


def timed_iter(original):
    def __iter__(self):
        started = time.monotonic()
        try:
            return original(self)
        finally:
            ITERS_S.append(time.monotonic() - started)
    return __iter__


def main() -> None:
    fetchers._PrefetchDataFetcher.__iter__ = timed_iter(fetchers._PrefetchDataFetcher.__iter__)
    db = sys.argv[1]
    trainer = L.Trainer(max_epochs=EPOCHS, profiler="simple", callbacks=[WatchLoaders(db=db)],
                        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(Model(), datamodule=Data("--persistent" in sys.argv))
    store = RunStore(db)
    run = next(r for r in store.list_runs() if r.label == "train")
    print(json.dumps({
        "lightning_s": list(trainer.profiler.recorded_durations[FETCH]),
        "tool_s": [row.wait_s for row in sorted(store.batches(run.id), key=lambda r: r.seq)],
        "iters_s": ITERS_S, "batches_per_epoch": BATCHES}))


if __name__ == "__main__":
    main()
