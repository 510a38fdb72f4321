"""The built-in demo (`dataloader_tuner.demo`, what the dashboard opens on): a dataset with a
training step, where the module's train_step stands in for the model.

Each sample costs 1 ms of CPU (16 ms per batch of 16), measured on the thread's CPU clock so
that the demo behaves the same on a fast or a slow machine. The step waits 12 ms per batch the
way a GPU step leaves the CPU free (the host waits on the device), plus a little CPU work. One
worker cannot keep up (16 ms per batch > 12 ms per step); two can. The question here is not top
loader speed but the fewest workers that keep the step fed.
"""

import time

import torch
from torch.utils.data import Dataset

batch_size = 16
SAMPLE_CPU_S = 0.001


class FeatureDataset(Dataset):
    def __init__(self, length: int = 8192, cpu_s: float = SAMPLE_CPU_S) -> None:
        self.length, self.cpu_s = length, cpu_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        acc, end = index, time.thread_time() + self.cpu_s
        while time.thread_time() < end:  # pure-Python work, holds the GIL, until 1 ms of CPU
            for i in range(50):
                acc = (acc * 1103515245 + 12345 + i) & 0x7FFFFFFF
        return torch.full((256,), float(acc % 97) / 97.0), acc % 2


def make_dataset() -> Dataset:
    return FeatureDataset()


def train_step(batch) -> None:
    """Stands in for forward + backward on a GPU: a little host work, then a wait."""
    features, _ = batch
    # Not a matmul: BLAS threads spin on the CPU for milliseconds after one, which would
    # make this stand-in step eat a core that a real GPU step leaves to the workers.
    features.sum(dim=1).max().item()
    time.sleep(0.012)
