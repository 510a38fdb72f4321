"""A Hugging Face Trainer run (a tiny BERT from a local config: nothing downloaded) with its
fetches timed where they hold only the fetch: the Trainer's ``get_batch_samples``, which asks
its (accelerate-prepared) loader for the step's batches. 2 epochs of 16 batches of 8, 2
workers, watched in one line. Prints, as JSON, the fetches' time by epoch and the tool's
input wait of the train loader by epoch. argv: DB OUTPUT_DIR [--persistent]"""

import json
import sys
import time

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import dataloader_tuner

BATCHES, EPOCHS = 16, 2


class Tokens(Dataset):
    """Token ids of a made-up text; 1.5 ms to make each, like a tokenizer on a long one."""

    def __len__(self) -> int:
        return 8 * BATCHES

    def __getitem__(self, index: int):
        time.sleep(0.0015)
        ids = torch.randint(0, 100, (32,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": index % 2}


class TimedTrainer(Trainer):
    """The Trainer, each of its fetches timed: ``next()`` on its epoch iterator, as
    ``get_batch_samples`` asks for a step's batches (the step's own bookkeeping left out)."""

    fetches: list[float] = []

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        timed = _Timed(epoch_iterator, self.fetches)
        return super().get_batch_samples(timed, num_batches, device)


class _Timed:
    def __init__(self, iterator, fetches: list[float]) -> None:
        self.iterator, self.fetches = iterator, fetches

    def __iter__(self):
        return self

    def __next__(self):
        started = time.monotonic()
        try:
            return next(self.iterator)
        finally:
            self.fetches.append(time.monotonic() - started)


def main() -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    args = TrainingArguments(
        output_dir=sys.argv[2], num_train_epochs=EPOCHS, per_device_train_batch_size=8,
        dataloader_num_workers=2, dataloader_persistent_workers="--persistent" in sys.argv,
        eval_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
        logging_strategy="no", disable_tqdm=True)
    trainer = TimedTrainer(model=BertForSequenceClassification(config), args=args,
                           train_dataset=Tokens())
    dataloader_tuner.watch_trainer(trainer, db=sys.argv[1])  # the one line
    trainer.train()
    store = dataloader_tuner.RunStore(sys.argv[1])
    run = next(r for r in store.list_runs() if r.label == "train")
    rows = store.batches(run.id)
    print(json.dumps({
        "fetches_s": trainer.fetches,
        "tool_by_epoch_s": [sum(r.wait_s for r in rows if r.epoch == e) for e in range(EPOCHS)],
        "tool_s": [r.wait_s for r in sorted(rows, key=lambda r: r.seq)],
        "tool_batches": len(rows)}))


if __name__ == "__main__":
    main()
