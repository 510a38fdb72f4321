"""Speech-commands-style audio (torchaudio ``SPEECHCOMMANDS`` / ESPnet / wav2vec2 fine-tuning
shape): 16-bit mono WAV clips of 0.5 to 1 s at 16 kHz, padded per batch, with a training step.

Why the shape matters: samples vary in length (8000..16000 samples), so the collate pads to
the longest clip in the batch and returns ``(waveforms [B, T], lengths [B], labels [B])``: T
changes from batch to batch. ``train_step`` runs a small 1-D convolution on the CPU, so the
loader competes with the model for cores, as in a CPU or small-GPU training job.

Data: 200 WAV files (tones plus noise, 10 classes evenly used) written with the stdlib
``wave`` module, about 4.8 MB.
"""

from __future__ import annotations

import os
import wave

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

try:
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    from _data import fixture_dir

NUM_CLIPS = 200
NUM_CLASSES = 10
RATE = 16_000
MIN_LEN, MAX_LEN = 8_000, 16_000

batch_size = 16

# a fixed filter bank: 8 filters of 31 taps (a stand-in for a learned front end)
_WEIGHT = torch.sin(torch.outer(torch.arange(1, 9, dtype=torch.float32),
                                torch.linspace(0, 3.1416, 31))).unsqueeze(1) / 31


def _build(folder: str) -> None:
    rng = np.random.default_rng(11)
    for i in range(NUM_CLIPS):
        label = i % NUM_CLASSES
        n = int(rng.integers(MIN_LEN, MAX_LEN + 1))
        t = np.arange(n) / RATE
        signal = 0.3 * np.sin(2 * np.pi * (200 + 100 * label) * t) + rng.normal(0, 0.05, n)
        pcm = np.clip(signal * 32767, -32768, 32767).astype("<i2")
        with wave.open(os.path.join(folder, f"clip_{i:04d}_label{label}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(pcm.tobytes())


class WavClips(Dataset):
    def __init__(self, root: str) -> None:
        self.files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".wav"))
        self.labels = [int(f.rsplit("label", 1)[1].split(".")[0]) for f in self.files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        with wave.open(self.files[index], "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        waveform = torch.from_numpy(pcm.astype(np.float32) / 32768.0)
        return waveform, self.labels[index]


def collate_fn(batch):
    """Pad to the longest clip: (waveforms [B, T], lengths [B], labels [B])."""
    waves, labels = zip(*batch)
    lengths = torch.tensor([len(w) for w in waves], dtype=torch.int64)
    padded = torch.zeros(len(waves), int(lengths.max()))
    for i, w in enumerate(waves):
        padded[i, :len(w)] = w
    return padded, lengths, torch.tensor(labels, dtype=torch.int64)


def train_step(batch) -> float:
    """A tiny CPU front end: strided conv1d over the padded waveforms."""
    waveforms, lengths, labels = batch
    features = F.conv1d(waveforms.unsqueeze(1), _WEIGHT, stride=4)
    return float(features.abs().mean())


def make_dataset(root: str | None = None) -> WavClips:
    return WavClips(root or fixture_dir("audio_like-v1", _build))


EXPECTED = {
    "samples_per_batch": 16,
    "diagnostics_present": [],
    "diagnostics_absent": ["skewed_labels", "worker_memory_growth"],
    "note": "variable-length waveforms padded per batch; T varies between batches",
}
