"""A dataset whose samples spend known shares of their CPU time in three named functions:
reading 20%, decoding 50%, augmenting 30% (each a spin on the thread's CPU clock), for the
sampled profile to be checked against (tests/test_hotspots.py)."""

import time

import torch
from torch.utils.data import Dataset

batch_size = 8
SHARES = {"read_bytes": 0.2, "decode_sample": 0.5, "augment": 0.3}
SAMPLE_CPU_S = 0.001


def _spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def read_bytes() -> None:
    _spin(SHARES["read_bytes"] * SAMPLE_CPU_S)


def decode_sample() -> None:
    _spin(SHARES["decode_sample"] * SAMPLE_CPU_S)


def augment() -> None:
    _spin(SHARES["augment"] * SAMPLE_CPU_S)


class KnownStages(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        read_bytes()
        decode_sample()
        augment()
        return torch.full((4,), float(index))


dataset = KnownStages()
