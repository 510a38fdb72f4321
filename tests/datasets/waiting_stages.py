"""A dataset whose samples spend known shares of their time in three named functions, most of
it waiting: reading 60% (a sleep, as a remote read or a slow disk waits), decoding 25% and
augmenting 15% (spins on the thread's CPU clock), for the sampled profile's time and CPU to be
checked apart (tests/test_hotspots.py)."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 8
SHARES = {"read_bytes": 0.6, "decode_sample": 0.25, "augment": 0.15}
SAMPLE_S = 0.002


def _spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def read_bytes() -> None:
    time.sleep(SHARES["read_bytes"] * SAMPLE_S)


def decode_sample() -> None:
    _spin(SHARES["decode_sample"] * SAMPLE_S)


def augment() -> None:
    _spin(SHARES["augment"] * SAMPLE_S)


class WaitingStages(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int):
        read_bytes()
        decode_sample()
        augment()
        return torch.full((4,), float(index))


dataset = WaitingStages()
