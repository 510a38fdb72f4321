"""An audio classifier's training script (UrbanSound8K / ESC-50 tutorial shape): a metadata
table, WAV clips read and resampled per sample, a log-Mel spectrogram, and a small 2-D CNN
trained on the CPU in ``train_step``. No pandas or torchaudio: the stdlib ``csv`` and ``wave``
modules, torchaudio's windowed-sinc resampling with its kernel designed in numpy on every call
(as ``scipy.signal.resample_poly`` designs its filter per call), and ``MelSpectrogram`` written
out with ``torch.stft`` and an HTK mel filterbank built once at import.

Why the shape matters: loading costs about three times the step, and both want the CPU.
With ``num_workers=0`` (the setting many users leave) the step waits for data ~3/4 of the
time (~160 samples/s on this 2-core machine, ~0.6 s of loading and ~0.24 s of step a batch);
workers help, but they compete with the step's own intra-op threads for the same two cores,
so a training loop gains much less than a load-only loop (4 workers: ~1.35x of 0 workers
training, ~1.8x loading only). A tuner that ignores the step overrates more workers. An epoch
is short (6 batches), so non-persistent workers restart often.

Data: 720 mono 16-bit WAV clips at 22050 Hz of 0.9 to 2 s (tones, chirps and noise, 10
classes evenly used) and ``metadata.csv`` (path, label, duration), ~46 MB, ~4 s to write.
"""

from __future__ import annotations

import csv
import math
import os
import random
import wave

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

try:
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    from _data import fixture_dir

NUM_CLIPS = 720
NUM_CLASSES = 10
FILE_RATE, RATE = 22_050, 16_000
MIN_S, MAX_S = 0.9, 2.0
N_FFT, HOP, N_MELS = 400, 160, 64

batch_size = 128
dataloader_kwargs = {"shuffle": True}


def _build(folder: str) -> None:
    rng = np.random.default_rng(8732)
    os.makedirs(os.path.join(folder, "audio"))
    rows = []
    for i in range(NUM_CLIPS):
        label = i % NUM_CLASSES
        n = int(rng.uniform(MIN_S, MAX_S) * FILE_RATE)
        t = np.arange(n) / FILE_RATE
        f0 = 150 * (label + 1) * rng.uniform(0.9, 1.1)
        sweep = f0 * (1 + 0.3 * label / NUM_CLASSES * t)  # a chirp: each class its own slope
        signal = (0.3 * np.sin(2 * np.pi * sweep * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
                  + rng.normal(0, 0.05, n))
        pcm = np.clip(signal * 32767, -32768, 32767).astype("<i2")
        name = os.path.join("audio", f"{i:05d}-{label}.wav")
        with wave.open(os.path.join(folder, name), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(FILE_RATE)
            w.writeframes(pcm.tobytes())
        rows.append((name, label, f"{n / FILE_RATE:.4f}"))
    with open(os.path.join(folder, "metadata.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "duration"])
        writer.writerows(rows)


# -- resample(waveform, 22050, 16000): torchaudio.functional.resample's windowed sinc (hann,
# lowpass_filter_width 6, rolloff 0.99) with its kernel designed in numpy (float64) on every call,
# as scipy.signal.resample_poly designs its filter per call: most of a sample's cost, on one
# core (numpy does not spread it over threads; torch's own elementwise ops would).

def _sinc_kernel(orig: int, new: int, lowpass_filter_width: int = 6, rolloff: float = 0.99):
    gcd = math.gcd(orig, new)
    orig, new = orig // gcd, new // gcd
    base = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base)
    idx = np.arange(-width, width + orig) / orig
    t = (np.arange(0, -new, -1)[:, None] / new + idx[None, :]) * base  # [new, taps]
    t = np.clip(t, -lowpass_filter_width, lowpass_filter_width)
    window = np.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t *= math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        kernel = np.where(t == 0, 1.0, np.sin(t) / t)
    kernel = torch.from_numpy((kernel * window * base / orig).astype(np.float32))
    return kernel[:, None, :], width, orig, new


def resample(waveform: torch.Tensor, orig_freq: int, new_freq: int) -> torch.Tensor:
    """[T] at orig_freq -> [ceil(T * new_freq / orig_freq)] at new_freq."""
    kernel, width, orig, new = _sinc_kernel(orig_freq, new_freq)
    length = waveform.shape[-1]
    padded = F.pad(waveform[None], (width, width + orig))
    out = F.conv1d(padded[:, None], kernel, stride=orig)  # [1, new, frames]
    out = out.transpose(1, 2).reshape(-1)
    return out[:math.ceil(new * length / orig)]


# -- torchaudio.transforms.MelSpectrogram(16000, n_fft=400, hop_length=160, n_mels=64) ------------

def _mel_filterbank(n_freqs: int, n_mels: int, rate: int) -> torch.Tensor:
    """[n_freqs, n_mels] triangular filters on the HTK mel scale (melscale_fbanks, norm=None)."""
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    freqs = np.linspace(0, rate // 2, n_freqs)
    points = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(rate / 2), n_mels + 2))
    slopes = points[None, :] - freqs[:, None]  # [n_freqs, n_mels + 2]
    diff = np.diff(points)
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    return torch.from_numpy(np.maximum(0.0, np.minimum(down, up))).to(torch.float32)


_MEL = _mel_filterbank(N_FFT // 2 + 1, N_MELS, RATE)
_WINDOW = torch.hann_window(N_FFT)


def log_mel(waveform: torch.Tensor) -> torch.Tensor:
    """[T] at 16 kHz -> [1, 64, frames] log-Mel power, normalised per sample."""
    spec = torch.stft(waveform, N_FFT, hop_length=HOP, window=_WINDOW, center=True,
                      pad_mode="reflect", return_complex=True).abs().pow(2)
    mel = torch.log(_MEL.T @ spec + 1e-6)
    return ((mel - mel.mean()) / (mel.std() + 1e-5))[None]


class ClipTable(Dataset):
    """Rows of ``metadata.csv``; each item is (log-Mel [1, 64, 101], label)."""

    def __init__(self, root: str) -> None:
        self.root = root
        with open(os.path.join(root, "metadata.csv"), newline="") as f:
            self.rows = [(row["path"], int(row["label"]), float(row["duration"]))
                         for row in csv.DictReader(f)]
        self.targets = [label for _, label, _ in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        path, label, _ = self.rows[index]
        with wave.open(os.path.join(self.root, path), "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        waveform = torch.from_numpy(pcm.astype(np.float32) / 32768.0)
        # a random 1 s crop (python's random: reseeded per worker), zero-padded when shorter;
        # cropped before resampling, so every resample sees the same length
        if len(waveform) > FILE_RATE:
            start = random.randint(0, len(waveform) - FILE_RATE)
            waveform = waveform[start:start + FILE_RATE]
        else:
            waveform = F.pad(waveform, (0, FILE_RATE - len(waveform)))
        waveform = resample(waveform, FILE_RATE, RATE)  # exactly RATE samples: 1 s
        return log_mel(waveform), label


def make_dataset(root: str | None = None) -> ClipTable:
    return ClipTable(root or fixture_dir("audio_mel-v1", _build))


# -- the model and its CPU training step (built at import, as in a script) -------------------------

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(32, NUM_CLASSES),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train_step(batch) -> float:
    mels, labels = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(mels), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


EXPECTED = {
    "samples_per_batch": 128,
    "diagnostics_present": [],
    "diagnostics_absent": ["skewed_labels", "worker_memory_growth"],
    "label_counts": {c: NUM_CLIPS // NUM_CLASSES for c in range(NUM_CLASSES)},
    "note": "loading ~3/4 and the CPU step ~1/4 of a batch at num_workers=0",
}
