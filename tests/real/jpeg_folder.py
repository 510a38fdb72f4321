"""torchvision ``ImageFolder`` without torchvision: ``root/<class>/<image>.jpg`` decoded with
Pillow, a random 64x64 crop, converted to a float tensor through numpy.

Why the shape matters: this is the most common real target. The work per sample is JPEG
decoding (CPU-bound, in C, releasing little), the labels are evenly used and exposed as
``.targets`` / ``.samples`` like ImageFolder, and ``shuffle=True`` is the user's setting.
Nothing here leaks or is skewed.

Data: 200 JPEGs of 96x96 pixels, 4 classes x 50, written with Pillow.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

try:
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    from _data import fixture_dir

CLASSES = ["cat", "dog", "fox", "owl"]
PER_CLASS = 50
SIZE, CROP = 96, 64

batch_size = 32
dataloader_kwargs = {"shuffle": True}


def _build(folder: str) -> None:
    rng = np.random.default_rng(3)
    ramp = np.linspace(0, 255, SIZE, dtype=np.float32)
    for c, name in enumerate(CLASSES):
        os.makedirs(os.path.join(folder, name))
        for n in range(PER_CLASS):
            # smooth gradients plus noise: compresses like a photo, not like pure noise
            base = (ramp[None, :, None] * (c + 1) / 4 + ramp[:, None, None] / 2) % 256
            noise = rng.normal(0, 20, size=(SIZE, SIZE, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(folder, name, f"img_{n}.jpg"), quality=90)


class ImageFolderLike(Dataset):
    """``samples`` = [(path, class_index)], ``targets`` = [class_index], like ImageFolder."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [
            (os.path.join(root, name, file), self.class_to_idx[name])
            for name in self.classes
            for file in sorted(os.listdir(os.path.join(root, name)))
            if file.endswith(".jpg")
        ]
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        with Image.open(path) as im:
            im = im.convert("RGB")
            # RandomCrop(64): python's random is reseeded per worker by the DataLoader
            left, top = random.randint(0, SIZE - CROP), random.randint(0, SIZE - CROP)
            im = im.crop((left, top, left + CROP, top + CROP))
            array = np.asarray(im, dtype=np.float32) / 255.0
        return torch.from_numpy(array.transpose(2, 0, 1).copy()), label


def make_dataset(root: str | None = None) -> ImageFolderLike:
    return ImageFolderLike(root or fixture_dir("jpeg_folder-v1", _build))


EXPECTED = {
    "samples_per_batch": 32,
    "diagnostics_present": [],
    "diagnostics_absent": ["worker_memory_growth", "skewed_labels"],
    "label_counts": {c: PER_CLASS for c in range(len(CLASSES))},
}
