"""An ImageNet training script's input pipeline without torchvision: ``ImageFolder`` over
photo-sized JPEGs with the reference train transforms done by hand (``RandomResizedCrop(224)``,
``RandomHorizontalFlip``, ``ToTensor``, ``Normalize``), ``batch_size=256``, 4 workers,
``shuffle=True``, ``pin_memory=True``: the settings of pytorch/examples' imagenet/main.py.

Why the shape matters: this is the slow, CPU-bound case users tune most. A batch costs about
0.8 s in the main process on this machine (JPEG decode of a 375x500 to 800x600 photo, a
bilinear resize of a random crop, float conversion and normalisation of 3x224x224 per sample),
so a tuner sees few batches per trial. The dataset is small (1024 images: 4 batches an
epoch), so non-persistent workers restart every 4 batches, as they do at each epoch of a real
job; the restart (fork, each worker's first batch) is a visible part of the loop. A batch is
154 MB of float32, so collating and passing it between processes costs too.
``pin_memory=True`` without an accelerator is what a user's script passes anyway (the
DataLoader warns and does not pin).

Data: 1024 JPEGs (4 classes x 256) of 500x375, 375x500, 640x480, 480x640 and 800x600 pixels,
smooth colour fields plus mid-frequency texture and noise (so they compress like photos,
~85 KB each at quality 90, ~90 MB in all), written with Pillow once (~20 s).
"""

from __future__ import annotations

import math
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

CLASSES = ["n01440764", "n01443537", "n01484850", "n01491361"]  # ImageNet-style wnids
PER_CLASS = 256
SIZES = [(500, 375), (375, 500), (640, 480), (480, 640), (800, 600)]  # (width, height)
CROP = 224
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

batch_size = 256
dataloader_kwargs = {"num_workers": 4, "shuffle": True, "pin_memory": True}


def _photo(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A photo-like uint8 HxWx3 array: a smooth colour field, texture, and sensor noise."""
    low = rng.uniform(0, 255, size=(int(rng.integers(3, 7)), int(rng.integers(3, 7)), 3))
    base = np.asarray(Image.fromarray(low.astype(np.uint8)).resize((width, height),
                                                                  Image.BICUBIC), np.float32)
    texture = rng.normal(128, 25, size=(height // 16 + 1, width // 16 + 1, 3))
    texture = np.asarray(Image.fromarray(np.clip(texture, 0, 255).astype(np.uint8)).resize(
        (width, height), Image.BILINEAR), np.float32) - 128
    noise = rng.normal(0, 8, size=(height, width, 3)).astype(np.float32)
    return np.clip(base + texture + noise, 0, 255).astype(np.uint8)


def _build(folder: str) -> None:
    rng = np.random.default_rng(2012)
    for c, name in enumerate(CLASSES):
        os.makedirs(os.path.join(folder, name))
        for n in range(PER_CLASS):
            width, height = SIZES[(c * PER_CLASS + n) % len(SIZES)]
            Image.fromarray(_photo(rng, width, height)).save(
                os.path.join(folder, name, f"{name}_{n:05d}.JPEG"), quality=90)


def random_resized_crop_params(width: int, height: int) -> tuple[int, int, int, int]:
    """(top, left, height, width) as torchvision's RandomResizedCrop.get_params: 10 tries of a
    random area and log-uniform aspect ratio, then a centre crop clamped to the ratio range."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target_area = area * random.uniform(*SCALE)
        aspect = math.exp(random.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(RATIO):
        w, h = width, int(round(width / min(RATIO)))
    elif in_ratio > max(RATIO):
        w, h = int(round(height * max(RATIO))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class ImageFolderLike(Dataset):
    """``samples`` = [(path, class_index)], ``targets``, ``classes``, ``class_to_idx`` like
    torchvision's ImageFolder; ``__getitem__`` applies the ImageNet train transforms."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [
            (os.path.join(root, name, file), self.class_to_idx[name])
            for name in self.classes
            for file in sorted(os.listdir(os.path.join(root, name)))
            if file.lower().endswith((".jpeg", ".jpg"))
        ]
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        with open(path, "rb") as f:  # torchvision's pil_loader
            im = Image.open(f)
            im = im.convert("RGB")
        # RandomResizedCrop(224): python's random is reseeded per worker by the DataLoader
        top, left, h, w = random_resized_crop_params(*im.size)
        im = im.crop((left, top, left + w, top + h)).resize((CROP, CROP), Image.BILINEAR)
        if random.random() < 0.5:  # RandomHorizontalFlip
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        # ToTensor: HWC uint8 -> CHW float in [0, 1]; Normalize with ImageNet's mean and std
        tensor = torch.from_numpy(np.array(im, np.uint8, copy=True))
        tensor = tensor.permute(2, 0, 1).contiguous().to(torch.float32).div(255)
        return tensor.sub_(MEAN).div_(STD), label


def make_dataset(root: str | None = None) -> ImageFolderLike:
    return ImageFolderLike(root or fixture_dir("imagenet_like-v1", _build))


EXPECTED = {
    "samples_per_batch": 256,
    "diagnostics_present": [],
    "diagnostics_absent": ["worker_memory_growth", "skewed_labels"],
    "label_counts": {c: PER_CLASS for c in range(len(CLASSES))},
    "note": "~0.8 s a batch at num_workers=0; 4 batches an epoch, so non-persistent workers "
            "restart every 4 batches",
}
