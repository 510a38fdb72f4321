"""What does the one line cost a trainer's training? Each framework's training, watched and
not, in turns.

Per framework, one process trains with it (accelerate's prepared loader, the Hugging Face
Trainer, Lightning; a plain loop for reference) over and over, alternating watched and plain
after one of each to warm up: a fresh process per trial added its own start (imports, page
faults, the first fork of a big process) to the spread, several percent on this machine, more
than what is measured. Each training is 3 epochs of 96 batches, 2 workers restarted each epoch,
a sample taking 0.5 ms to make (the two workers make a batch of 16 in ~4 ms) and a step of
~10 ms (a small model's forward and backward, then a sleep for the rest: a GPU step leaves the
CPU free). The time is the training call's (``trainer.train()``, ``trainer.fit()``, the loop),
from before the line that watches: the watcher's start, its per-batch records, its recorder
thread writing to SQLite and its end are all in it. The model's forward runs on one thread (as
a GPU job's CPU side does): on this 2-core machine its default pool fights the two workers and
the trials' spread grows several-fold.

Per framework: the median of watched/plain over rounds (target <= 1.01) with a 90% bootstrap
interval of that median, the median seconds of each, and the median difference in ms (most of
it paid once per training: the watcher's start and its runs' end; a longer training divides
it).

    ../shared/tools/capped 6 -- python bench/trainer_overhead.py [--rounds 60] [--epochs 3]
        [--only NAME] [--raw FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORKS = ["plain loop", "accelerate", "Hugging Face Trainer", "Lightning"]
EPOCHS, BATCHES, BATCH_SIZE, SAMPLE_S, STEP_S = 3, 96, 16, 0.0005, 0.010


def trial(framework: str, watched: bool, db: str) -> float:
    """One training in this process: seconds of its training call."""
    import torch

    import dataloader_tuner
    import dataloader_tuner.watcher.loader  # noqa: F401 - imported by both variants

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        time.sleep(STEP_S)  # the rest of the step, on the GPU
        return loss

    if framework == "plain loop":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        started = time.monotonic()
        batches = dataloader_tuner.watch(samples_loader(), db=db) if watched else samples_loader()
        for _ in range(EPOCHS):
            for x, y in batches:
                step(x, y).backward()
                optimizer.step()
                optimizer.zero_grad()
        end_watched_runs()
        return time.monotonic() - started
    if framework == "accelerate":
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model, optimizer, prepared = accelerator.prepare(model, optimizer, samples_loader())
        started = time.monotonic()
        if watched:
            prepared = dataloader_tuner.watch(prepared, db=db)
        for _ in range(EPOCHS):
            for x, y in prepared:
                accelerator.backward(step(x, y))
                optimizer.step()
                optimizer.zero_grad()
        end_watched_runs()
        return time.monotonic() - started
    if framework == "Hugging Face Trainer":
        from transformers import Trainer, TrainingArguments

        class Classifier(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, x, labels):
                return {"loss": step(x, labels)}

        def collate(samples):
            return {"x": torch.stack([s[0] for s in samples]),
                    "labels": torch.tensor([s[1] for s in samples])}

        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(
                output_dir=out, num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH_SIZE,
                dataloader_num_workers=2, save_strategy="no", report_to=[], use_cpu=True,
                logging_strategy="no", disable_tqdm=True)
            trainer = Trainer(model=Classifier(), args=args, train_dataset=samples(),
                              data_collator=collate)
            started = time.monotonic()
            if watched:
                dataloader_tuner.watch_trainer(trainer, db=db)
            trainer.train()
            return time.monotonic() - started
    if framework == "Lightning":
        import lightning as L

        from dataloader_tuner.lightning import WatchLoaders

        class Module(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def training_step(self, batch, batch_idx):
                return step(*batch)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        started = time.monotonic()
        trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False,
                            callbacks=[WatchLoaders(db=db)] if watched else [])
        trainer.fit(Module(), train_dataloaders=samples_loader())
        return time.monotonic() - started
    raise SystemExit(f"unknown framework {framework!r}: one of {FRAMEWORKS}")


def samples(batches: int = BATCHES) -> Any:
    """A dataset of ``batches`` batches' samples, each 0.5 ms to make."""
    import torch
    from torch.utils.data import Dataset

    class Samples(Dataset):
        def __len__(self) -> int:
            return batches * BATCH_SIZE

        def __getitem__(self, index: int):
            time.sleep(SAMPLE_S)  # reading and decoding it
            return torch.randn(32), index % 4

    return Samples()


def samples_loader(batches: int = BATCHES) -> Any:
    """A new DataLoader over samples(batches), shuffled, with 2 workers."""
    from torch.utils.data import DataLoader

    return DataLoader(samples(batches), batch_size=BATCH_SIZE, shuffle=True, num_workers=2)


def end_watched_runs() -> None:
    """The runs a training watched end with it, as the Trainer's and Lightning's do: the
    trials share one process, and a run left open keeps its recorder thread sampling every
    later trial, plain or watched. (A script's runs end at its exit: the same call.)"""
    from dataloader_tuner.watcher.shutdown import _end_all

    _end_all()


def run_rounds(framework: str, rounds: int, db: str) -> dict[str, list[float]]:
    """``rounds`` trainings of each variant in one fresh process, in turns."""
    done = subprocess.run(
        [sys.executable, __file__, "--epochs", str(EPOCHS), "--rounds-of", framework,
         str(rounds), db],
        capture_output=True, text=True, timeout=1800, cwd=os.path.dirname(db),
        env=dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1"))
    if done.returncode != 0:
        raise SystemExit(f"{framework} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rounds_here(framework: str, rounds: int, db: str) -> dict[str, list[float]]:
    """In this process: one training of each to warm up, then ``rounds`` pairs, each pair's
    order alternating."""
    trial(framework, False, db)
    trial(framework, True, db)
    times: dict[str, list[float]] = {"plain": [], "watched": []}
    for round_ in range(rounds):
        for watched in ([False, True] if round_ % 2 == 0 else [True, False]):
            times["watched" if watched else "plain"].append(trial(framework, watched, db))
    return times


def main() -> None:
    global EPOCHS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60,
                        help="pairs per framework (20 left intervals 2-4%% wide here)")
    parser.add_argument("--epochs", type=int, default=EPOCHS,
                        help="epochs per training (what is paid once weighs less in more)")
    parser.add_argument("--only", choices=FRAMEWORKS)
    parser.add_argument("--raw", metavar="FILE",
                        help="also write each training's seconds there (JSON)")
    parser.add_argument("--rounds-of", nargs=3, metavar=("FRAMEWORK", "ROUNDS", "DB"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    EPOCHS = args.epochs
    if args.rounds_of:
        framework, rounds, db = args.rounds_of
        print(json.dumps(rounds_here(framework, int(rounds), db)))
        return
    print(f"{EPOCHS} epochs x {BATCHES} batches of {BATCH_SIZE}, 2 workers, "
          f"{STEP_S * 1000:.0f} ms step; {args.rounds} rounds in one process, alternating")
    print(f"{'framework':<22} {'watched/plain':>13} {'90% interval':>15} {'plain s':>8} "
          f"{'watched s':>9} {'diff ms':>8}")
    raw: dict[str, dict[str, list[float]]] = {}
    for framework in [args.only] if args.only else FRAMEWORKS:
        with tempfile.TemporaryDirectory() as folder:
            times = run_rounds(framework, args.rounds, os.path.join(folder, "runs.sqlite"))
        raw[framework] = times
        if args.raw:
            with open(args.raw, "w") as f:
                json.dump(raw, f)
        pairs = list(zip(times["watched"], times["plain"]))
        ratios = [watched / plain for watched, plain in pairs]
        low, high = median_interval(ratios)
        print(f"{framework:<22} {statistics.median(ratios):>13.3f} "
              f"{low:>7.3f}-{high:<7.3f} {statistics.median(times['plain']):>8.2f} "
              f"{statistics.median(times['watched']):>9.2f} "
              f"{1000 * statistics.median(w - p for w, p in pairs):>8.1f}", flush=True)


def median_interval(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 90% bootstrap interval of the median of ``values``."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(draws))
    return medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]


if __name__ == "__main__":
    main()
