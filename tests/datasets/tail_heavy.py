"""Per-sample times with a heavy tail, as a few huge files or a remote store's slow reads give:
one sample in 200 takes 0.4 s, the rest 0.5 ms (off the CPU, as waiting on storage). In order,
a batch holding a slow sample holds back every batch made after it, however deep the prefetch;
with in_order=False (torch >= 2.6) the others are delivered meanwhile (plain loops, 2 workers:
1.7x with prefetch_factor 2 or 4; 4 workers: 2.5x)."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 4
SLOW_EVERY, SLOW_S, FAST_S = 200, 0.4, 0.0005


class TailHeavy(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, index):
        time.sleep(SLOW_S if index % SLOW_EVERY == 7 else FAST_S)
        return torch.full((16,), float(index))


dataset = TailHeavy()
