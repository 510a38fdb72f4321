"""A Hugging Face Trainer run, watched in one line (a tiny BERT from a local config: nothing is
downloaded). Run it, then open the dashboard's Training jobs page:

    python examples/train_hf_trainer.py
    dataloader-tuner dashboard
"""

import time

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import dataloader_tuner


class Tokens(Dataset):
    """Token ids of a made-up text, 2 ms to make each (a tokenizer on a long one)."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int):
        time.sleep(0.002)
        ids = torch.randint(0, 100, (64,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": index % 2}


if __name__ == "__main__":
    config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=128)
    args = TrainingArguments(output_dir="hf-out", num_train_epochs=3,
                             per_device_train_batch_size=16, dataloader_num_workers=2,
                             eval_strategy="epoch", save_strategy="no", report_to=[],
                             use_cpu=not torch.cuda.is_available())
    trainer = Trainer(model=BertForSequenceClassification(config), args=args,
                      train_dataset=Tokens(), eval_dataset=Tokens())
    dataloader_tuner.watch_trainer(trainer)  # the one line
    trainer.train()
