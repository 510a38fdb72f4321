"""A Lightning training (2 epochs, a validation after each), its loaders watched by the one
callback. Prints, as JSON on rank 0, what training_step received (each batch's first index)
and the loop's own clock of its data wait, read by a callback: from each epoch's start to its
first batch, and from each batch's end to the next one's start.
argv: DB [--unwatched] [--ddp] (2 processes on gloo, Lightning's own launcher, loopback)
[--no-workers] (both loaders at num_workers=0: their fetch in the job's own process)."""

import json
import multiprocessing
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from dataloader_tuner import RunStore
from dataloader_tuner.lightning import WatchLoaders


class Slow(Dataset):
    """Sample i carries i, and a draw of its worker's torch generator (seeded by Lightning's
    worker_init_fn); 2 ms to make: 2 workers make an 8-sample batch in ~8 ms."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        time.sleep(0.002)
        x = torch.full((4,), float(index))
        x[1] = torch.rand(())
        return x, index % 2


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.received: list[tuple[int, float]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.received.append((int(x[0, 0]), round(float(x[0, 1]), 6)))
        time.sleep(0.003)  # the rest of a step
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


WORKERS = 0 if "--no-workers" in sys.argv else 2
# The ranks' workers start from a fork server: a worker forked from a rank can deadlock inside
# fork() on Python before 3.11.10 (CPython gh-112275) while a gloo thread of the rank makes a
# thread state, as it does as each collective's work ends (2 runs in ~170 here, 1 in CI).
CONTEXT = "forkserver" if "--ddp" in sys.argv and WORKERS else None
# (its workers start with torch and Lightning loaded: ~7 s an epoch's start-up otherwise)
multiprocessing.set_forkserver_preload(["torch", "lightning", "dataloader_tuner"])


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(Slow(192), batch_size=8, shuffle=True, num_workers=WORKERS,
                          multiprocessing_context=CONTEXT)

    def val_dataloader(self):
        return DataLoader(Slow(48), batch_size=8, num_workers=WORKERS,
                          multiprocessing_context=CONTEXT)


class LoopClock(L.Callback):
    """The training loop's own data wait and each epoch's start-up, as Lightning's hooks show
    them (on_train_batch_start comes once the batch was fetched)."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.startups: list[float] = []
        self.since: float | None = None
        self.first = False

    def on_train_epoch_start(self, trainer, pl_module):
        self.since, self.first = time.monotonic(), True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.since is not None:
            self.waited += time.monotonic() - self.since
            if self.first:
                self.startups.append(time.monotonic() - self.since)
        self.since, self.first = None, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.since = time.monotonic()

    def on_train_epoch_end(self, trainer, pl_module):
        self.since = None  # after the last batch came validation, not a wait for data


def main() -> None:
    L.seed_everything(0, workers=True)  # Lightning gives the loaders a worker_init_fn
    ddp = "--ddp" in sys.argv
    clock = LoopClock()
    callbacks: list = [clock]
    watched = "--unwatched" not in sys.argv
    if watched:
        callbacks.insert(0, WatchLoaders(db=sys.argv[1]))  # the one line
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=2 if ddp else 1,
                        strategy="ddp" if ddp else "auto", callbacks=callbacks, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    model = Model()
    started = time.monotonic()
    trainer.fit(model, datamodule=Data())
    if trainer.global_rank == 0:
        fit_s = time.monotonic() - started
        # The runs ended with the fit (a notebook's process would go on), not at exit.
        ended = ([run.status for run in RunStore(sys.argv[1]).list_runs()] if watched else [])
        print(json.dumps({"received": model.received, "waited_s": clock.waited,
                          "startups_s": clock.startups, "fit_s": fit_s, "ended": ended}))


if __name__ == "__main__":
    main()
