"""A text classification set tokenized on the fly with a Hugging Face fast tokenizer, as
run_glue-style scripts do when they skip ``datasets.map``: each ``__getitem__`` calls the
tokenizer on one sentence (truncation and padding to 128 tokens, PyTorch tensors back).

Why the shape matters: tokenization is the work, inside transformers' Python wrapper around
the Rust ``tokenizers`` library; a profile must name it (users ask whether to pre-tokenize).
The batch is a dict of [batch, 128] tensors plus the labels, collated by default.

Data: 4,096 sentences of 12-60 words drawn from a fixed vocabulary, 4 classes; the WordPiece
vocabulary (2,000 pieces) is trained on them in memory (no download), once per process.
"""

from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset

NUM_SENTENCES, NUM_CLASSES, MAX_LENGTH = 4096, 4, 128
WORDS = [f"{a}{b}" for a in ("data", "load", "work", "batch", "model", "token", "image", "audio")
         for b in ("er", "ing", "ed", "s", "", "able", "ness", "ful", "less", "ly")]

batch_size = 32


def _sentences() -> list[str]:
    rng = random.Random(7)
    return [" ".join(rng.choice(WORDS) + rng.choice(("", "x", "yz", "q"))
                     for _ in range(rng.randint(12, 60))) for _ in range(NUM_SENTENCES)]


def _tokenizer(corpus: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(corpus, trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[UNK]", "[PAD]", "[CLS]", "[SEP]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]",
                                   pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]")


class TokenizedText(Dataset):
    def __init__(self) -> None:
        self.texts = _sentences()
        self.labels = [i % NUM_CLASSES for i in range(NUM_SENTENCES)]
        self.tokenizer = _tokenizer(self.texts)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> dict:
        encoded = self.tokenizer(self.texts[index], truncation=True, max_length=MAX_LENGTH,
                                 padding="max_length", return_tensors="pt")
        item = {key: value[0] for key, value in encoded.items()}
        item["labels"] = torch.tensor(self.labels[index])
        return item


def make_dataset() -> TokenizedText:
    return TokenizedText()


EXPECTED = {
    "samples_per_batch": 32,
    "diagnostics_present": [],
    "diagnostics_absent": ["worker_memory_growth", "skewed_labels"],
}
