"""A dataset whose main process is slower in any process but the first that imports it: a
stand-in for what differs between processes (a heap, a cache, a lazily built table) that a
tune's one process cannot see. In the tune's process, 0 workers and workers read items alike;
in a second process (it inherits the marker set here), items read in its main process take
three times as long, so the speedup of workers there is three times the tune's own.
"""

import os
import time

import torch
from torch.utils.data import Dataset

MARKER = "PROCESS_BOUND_FIRST_PID"
FIRST = os.environ.setdefault(MARKER, str(os.getpid())) == str(os.getpid())
IMPORTED_IN = os.getpid()  # forked workers see this, and are not it
ITEM_S = 0.001

batch_size = 8


class ProcessBound(Dataset):
    def __len__(self) -> int:
        return 4000

    def __getitem__(self, index: int):
        in_main = os.getpid() == IMPORTED_IN
        time.sleep(ITEM_S * (3 if in_main and not FIRST else 1))
        return torch.full((16,), float(index))


dataset = ProcessBound()
