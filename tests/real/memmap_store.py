"""An ``np.memmap``-backed sample store (the pattern of FFCV-style, LitData or nanoGPT-style
``.bin`` files): 20k images of 3x32x32 uint8 in one 60 MB file, read by index.

Why the shape matters: as workers read samples, the file's pages come into each
worker's RSS, which therefore climbs towards the file size, yet nothing leaks: those pages
are file-backed page cache, shared and reclaimable, and the worker's private memory (USS)
stays flat. A memory-growth rule that reads RSS alone would cry wolf here.

The memmap is opened lazily in each process (not pickled: pickling an ``np.memmap`` copies
the whole array into every spawned worker).

Reads take ``work_s`` (0.5 ms, a decode/augment stand-in) per sample and go in stored order
(the writer shuffled once, as FFCV/LitData writers do), with persistent workers: the file's
pages arrive steadily over the first epoch (~6.5 s) instead of all at once. (Read at random,
the kernel maps whole cached folios around each fault: 1000 random reads already map the
whole 58 MB, and RSS would jump in the first second rather than grow.)

Measured like ``copy_on_read_leak`` (``python3 tests/real/measure_memory.py memmap_store``
under ``capped 6``, 15 s, 2 workers), per worker:

    RSS 181 -> 228 MB in both (+9.5 MB/s up to t=6.5 s, the end of the first epoch, then flat)
    USS  13 ->  15 MB in both
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from torch.utils.data import Dataset

try:
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    from _data import fixture_dir

NUM_SAMPLES = 20_000
SHAPE = (3, 32, 32)
NUM_CLASSES = 10

batch_size = 128
dataloader_kwargs = {"num_workers": 2, "persistent_workers": True}  # read in stored order


def _build(folder: str) -> None:
    rng = np.random.default_rng(6)
    sample_bytes = int(np.prod(SHAPE))
    with open(os.path.join(folder, "images.u8"), "wb") as f:
        for start in range(0, NUM_SAMPLES, 2000):  # 6 MB at a time
            f.write(rng.bytes(min(2000, NUM_SAMPLES - start) * sample_bytes))
    labels = np.arange(NUM_SAMPLES, dtype=np.int64) % NUM_CLASSES
    np.save(os.path.join(folder, "labels.npy"), labels)


class MemmapStore(Dataset):
    def __init__(self, root: str, work_s: float = 0.0005) -> None:
        self.work_s = work_s
        self.path = os.path.join(root, "images.u8")
        self.labels = np.load(os.path.join(root, "labels.npy"))
        self._images: np.memmap | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def images(self) -> np.memmap:
        if self._images is None:
            self._images = np.memmap(self.path, dtype=np.uint8, mode="r",
                                     shape=(len(self.labels), *SHAPE))
        return self._images

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _images=None)

    def __getitem__(self, index: int):
        if self.work_s:
            time.sleep(self.work_s)
        x = torch.from_numpy(np.asarray(self.images[index], dtype=np.float32) / 255.0)
        return x, int(self.labels[index])


def make_dataset(root: str | None = None, work_s: float = 0.0005) -> MemmapStore:
    return MemmapStore(root or fixture_dir("memmap_store-v1", _build), work_s=work_s)


EXPECTED = {
    "samples_per_batch": 128,
    "diagnostics_present": [],
    "diagnostics_absent": ["worker_memory_growth", "skewed_labels"],
    "note": "worker RSS grows with file-backed pages of the memmap; USS stays flat",
}
