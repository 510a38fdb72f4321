"""torchvision's ``ImageFolder(root, transform=Compose([...]))`` without torchvision: the same
shapes by hand (torchvision's CUDA wheel does not import beside the CPU torch here), so that a
profile can name each transform of the ``Compose`` as torchvision users write it.

Why the shape matters: this is the pipeline users ask "which step costs what" about
(pytorch#6313, albumentations#1657). Each sample is a file opened by ``pil_loader``, a JPEG
decoded by Pillow (``convert("RGB")``), then four transform objects called in turn by a
``Compose``: ``RandomResizedCrop(112)`` (a PIL crop and bilinear resize), ``RandomHorizontalFlip``,
``ToTensor`` (uint8 HWC to float CHW) and ``Normalize``; ``default_collate`` stacks 32 of them.

Data: imagenet_like's 1024 photo-sized JPEGs (500x375 to 800x600), shared with it.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

try:
    from . import imagenet_like
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    import imagenet_like
    from _data import fixture_dir

CROP = 112
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

batch_size = 32
dataloader_kwargs = {"shuffle": True}


def pil_loader(path: str) -> Image.Image:
    """torchvision.datasets.folder.pil_loader: opened as a file, decoded to RGB."""
    with open(path, "rb") as f:
        image = Image.open(f)
        return image.convert("RGB")


class Compose:
    """torchvision.transforms.Compose: each transform called in turn."""

    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, image):
        for transform in self.transforms:
            image = transform(image)
        return image


class RandomResizedCrop:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Image.Image) -> Image.Image:
        top, left, h, w = imagenet_like.random_resized_crop_params(*image.size)
        return image.resize((self.size, self.size), Image.BILINEAR,
                            box=(left, top, left + w, top + h))


class RandomHorizontalFlip:
    def __call__(self, image: Image.Image) -> Image.Image:
        return image.transpose(Image.FLIP_LEFT_RIGHT) if random.random() < 0.5 else image


class ToTensor:
    def __call__(self, image: Image.Image) -> torch.Tensor:
        array = torch.from_numpy(np.array(image, np.uint8, copy=True))
        return array.permute(2, 0, 1).contiguous().to(torch.float32).div(255)


class Normalize:
    def __init__(self, mean: list[float], std: list[float]) -> None:
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std


class ImageFolder(Dataset):
    """``samples``, ``targets``, ``classes`` like torchvision's; ``transform`` on each image."""

    def __init__(self, root: str, transform=None, loader=pil_loader) -> None:
        self.classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
        self.samples = [(os.path.join(root, name, file), label)
                        for label, name in enumerate(self.classes)
                        for file in sorted(os.listdir(os.path.join(root, name)))]
        self.targets = [label for _, label in self.samples]
        self.transform, self.loader = transform, loader

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample, target


TRANSFORMS = ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize")


def make_dataset(root: str | None = None) -> ImageFolder:
    return ImageFolder(root or fixture_dir("imagenet_like-v1", imagenet_like._build),
                       transform=Compose([RandomResizedCrop(CROP), RandomHorizontalFlip(),
                                          ToTensor(), Normalize(MEAN, STD)]))


EXPECTED = {
    "samples_per_batch": 32,
    "diagnostics_present": [],
    "diagnostics_absent": ["worker_memory_growth", "skewed_labels"],
    "label_counts": {c: imagenet_like.PER_CLASS for c in range(len(imagenet_like.CLASSES))},
}
