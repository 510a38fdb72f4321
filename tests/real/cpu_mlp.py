"""A tabular / signal-feature pipeline with a small MLP trained on the CPU: each sample is
computed in Python and numpy from its index (feature engineering on a synthetic signal, ~2 ms
of pure CPU), and ``train_step`` is an MLP forward, backward and SGD step (~30 ms a batch).

Why the shape matters: the case another tool (loadtune) got wrong, picking 2 persistent
workers where 4 were best: the loading is pure CPU with no I/O to hide, the step competes for
the same cores (its intra-op threads), and an epoch is long (64 batches), so worker restarts
matter little and the choice rests on how loading and the step share two cores. Nothing is
read from disk: no fixture.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

NUM_SAMPLES = 4096
NUM_CLASSES = 10
SIGNAL, FEATURES, ROUNDS = 4096, 256, 9

batch_size = 64
dataloader_kwargs = {"shuffle": True}


class SignalFeatures(Dataset):
    """Item ``i``: (256 float32 features of a signal generated from ``i``, label ``i % 10``)."""

    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, index: int):
        label = index % NUM_CLASSES
        rng = np.random.default_rng(index)
        t = np.arange(SIGNAL) / SIGNAL
        signal = np.sin(2 * np.pi * (label + 1) * 8 * t) + rng.standard_normal(SIGNAL)
        features = np.zeros(FEATURES)
        for r in range(ROUNDS):  # smoothing at several scales, each summarised
            width = 2 ** (r + 1)
            smooth = np.convolve(signal, np.ones(width) / width, mode="same")
            spectrum = np.abs(np.fft.rfft(smooth))[:FEATURES]
            order = np.sort(smooth)
            features += spectrum / (1 + r) + np.interp(
                np.linspace(0, SIGNAL - 1, FEATURES), np.arange(SIGNAL), order)
        features = (features - features.mean()) / (features.std() + 1e-6)
        return torch.from_numpy(features.astype(np.float32)), label


def make_dataset() -> SignalFeatures:
    return SignalFeatures()


# -- the model and its CPU training step (built at import, as in a script) -------------------------

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(FEATURES, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                      nn.Linear(2048, NUM_CLASSES))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train_step(batch) -> float:
    features, labels = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(features), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


EXPECTED = {
    "samples_per_batch": 64,
    "diagnostics_present": [],
    "diagnostics_absent": ["worker_memory_growth", "skewed_labels"],
    "label_counts": {c: NUM_SAMPLES // NUM_CLASSES + (c < NUM_SAMPLES % NUM_CLASSES)
                     for c in range(NUM_CLASSES)},
    "note": "~2 ms of pure CPU per sample, ~30 ms of CPU training step per batch",
}
