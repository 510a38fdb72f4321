"""A Hugging Face Trainer run (a tiny BERT built from a local config: nothing downloaded),
watched in one line. Prints, as JSON, the loop's own clock of its data wait, read by a
callback: from each epoch's start to its first step, and from each step's end to the next
one's start. argv: DB OUTPUT_DIR."""

import json
import multiprocessing
import os
import sys
import time

import torch
from torch.utils.data import Dataset
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                          TrainingArguments)

import dataloader_tuner


class Tokens(Dataset):
    """Token ids of a made-up text; 1.5 ms to make each, like a tokenizer on a long one."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        time.sleep(0.0015)
        ids = torch.randint(0, 100, (32,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": index % 2}


class LoopClock(TrainerCallback):
    """The training loop's own data wait, as the Trainer's events show it."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.since: float | None = None
        self.started = self.ended = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.monotonic()

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.since = time.monotonic()

    def on_step_begin(self, args, state, control, **kwargs):
        if self.since is not None:
            self.waited += time.monotonic() - self.since
        self.since = None

    def on_step_end(self, args, state, control, **kwargs):
        self.since = time.monotonic()

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.since is not None:  # the wait for the epoch's end (its workers shutting down)
            self.waited += time.monotonic() - self.since
        self.since = None

    def on_train_end(self, args, state, control, **kwargs):
        self.ended = time.monotonic()


def main() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Workers from a fork server, as in lightning_fit.py: one forked from a rank can
        # deadlock inside fork() on Python before 3.11.10 (CPython gh-112275).
        multiprocessing.set_start_method("forkserver", force=True)
        multiprocessing.set_forkserver_preload(["torch", "transformers", "dataloader_tuner"])
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    args = TrainingArguments(
        output_dir=sys.argv[2], num_train_epochs=2, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, dataloader_num_workers=2, eval_strategy="epoch",
        save_strategy="no", report_to=[], use_cpu=True, logging_strategy="no",
        disable_tqdm=True)
    clock = LoopClock()
    trainer = Trainer(model=BertForSequenceClassification(config), args=args,
                      train_dataset=Tokens(128), eval_dataset=Tokens(32), callbacks=[clock])
    dataloader_tuner.watch_trainer(trainer, db=sys.argv[1])  # the one line
    trainer.train()
    # The runs ended with train() (a notebook's process would go on), not at exit.
    ended = [run.status for run in dataloader_tuner.RunStore(sys.argv[1]).list_runs()]
    # (the evaluations inside train() are in its time: the train loader's loop is not)
    print(json.dumps({"waited_s": clock.waited, "ended": ended}))


if __name__ == "__main__":
    main()
