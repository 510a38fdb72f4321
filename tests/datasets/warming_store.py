"""A record store that gets faster as it is read, as an LMDB or a file store does while the
page cache fills: the first read of a record waits (a cold disk), later reads are quick. The
store is opened before the fork, as a popular GAN repository opens its LMDB, so which records
are warm is shared by the main process and every worker (an anonymous shared mapping made in
``__init__``), as the page cache is. A tune that measures the user's settings cold early and
the pick warm late would claim the warming as a speedup.
"""

import mmap
import time

import torch
from torch.utils.data import Dataset

batch_size = 16
dataloader_kwargs = {"shuffle": True}  # each trial reads records in a new order, as training
COLD_S = 0.002  # the first read of a record waits this long
WARM_CPU_S = 0.00006  # every read decodes: CPU work, so workers pay once the store is warm
LENGTH = 2000


class WarmingStore(Dataset):
    def __init__(self, length: int = LENGTH) -> None:
        self.length = length
        self.warm = mmap.mmap(-1, length)  # one byte per record: 1 once read (shared, as pages)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if not self.warm[index]:
            time.sleep(COLD_S)
            self.warm[index] = 1
        until = time.perf_counter() + WARM_CPU_S
        while time.perf_counter() < until:
            pass
        return torch.full((64,), float(index)), index % 10

    def warm_up(self) -> None:
        self.warm.seek(0)
        self.warm.write(b"\x01" * self.length)


dataset = WarmingStore()
