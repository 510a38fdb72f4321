"""A dataset whose samples spend known shares of their CPU time in three named functions:
reading 20%, decoding 50%, augmenting 30% (each a spin on the thread's CPU clock), for the
sampled profile to be checked against (tests/test_hotspots.py). ``KNOWN_STAGES_SKIP=name,...``
in the environment leaves those functions out (tests/test_ceiling_real.py: a stage removed).
"""

import os
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


STAGES = (read_bytes, decode_sample, augment)


class KnownStages(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        skip = os.environ.get("KNOWN_STAGES_SKIP", "")  # (read per sample: ~0.3 us of 1 ms)
        for stage in STAGES:
            if stage.__name__ not in skip:
                stage()
        return torch.full((4,), float(index))


dataset = KnownStages()
