"""COCO-style object detection, as in torchvision's detection references (CocoDetection plus
``utils.collate_fn``).

Why the shape matters: a sample is ``(image, target)`` where ``target`` is a dict of
variable-length tensors (0 to 12 boxes, images with no box included) plus a plain int and a
list of Python float lists (polygons). The default collate cannot stack that, so the collate
returns the stacked images and a *list* of per-image dicts. ``labels`` here are per box, not
per sample: a tool must not read them as class labels and judge skew from them.

Data: ``annotations.json`` in COCO layout (images / annotations with xywh ``bbox``,
``category_id`` and ``segmentation`` polygons / categories) and ``images.npy`` (uint8 pixels),
parsed in the parent like ``pycocotools.coco.COCO``.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import torch
from torch.utils.data import Dataset

try:
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    from _data import fixture_dir

NUM_IMAGES = 256
SIZE = 64
MAX_BOXES = 12
POLYGON_POINTS = 20  # 20 (x, y) pairs = 40 floats per polygon

batch_size = 16


def _build(folder: str) -> None:
    rng = np.random.default_rng(1)
    np.save(os.path.join(folder, "images.npy"),
            rng.integers(0, 256, size=(NUM_IMAGES, 3, SIZE, SIZE), dtype=np.uint8))
    images, annotations = [], []
    for image_id in range(NUM_IMAGES):
        images.append({"id": image_id, "file_name": f"{image_id:012d}.jpg",
                       "height": SIZE, "width": SIZE})
        for _ in range(image_id % (MAX_BOXES + 1)):  # 0..12 boxes, every count used
            w, h = (float(v) for v in rng.uniform(4, 32, size=2))
            x, y = float(rng.uniform(0, SIZE - w)), float(rng.uniform(0, SIZE - h))
            polygon = []
            for p in range(POLYGON_POINTS):
                angle = 2 * math.pi * p / POLYGON_POINTS
                polygon += [round(x + w / 2 * (1 + math.cos(angle)), 2),
                            round(y + h / 2 * (1 + math.sin(angle)), 2)]
            annotations.append({"id": len(annotations), "image_id": image_id,
                                "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
                                "category_id": int(rng.integers(1, 81)), "area": w * h,
                                "iscrowd": 0, "segmentation": [polygon]})
    categories = [{"id": c, "name": f"category_{c}"} for c in range(1, 81)]
    with open(os.path.join(folder, "annotations.json"), "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)


class CocoLikeDetection(Dataset):
    """``(image [3,64,64] float, target dict)`` per image, boxes converted to xyxy."""

    def __init__(self, root: str) -> None:
        with open(os.path.join(root, "annotations.json")) as f:
            coco = json.load(f)
        self.ids = [image["id"] for image in coco["images"]]
        self.anns_by_image: dict[int, list[dict]] = {i: [] for i in self.ids}
        for ann in coco["annotations"]:
            self.anns_by_image[ann["image_id"]].append(ann)
        self.images = np.load(os.path.join(root, "images.npy"))  # 3 MB, held in memory

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int):
        image_id = self.ids[index]
        image = torch.from_numpy(np.asarray(self.images[index], dtype=np.float32) / 255.0)
        anns = self.anns_by_image[image_id]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy
        target = {
            "boxes": boxes,
            "labels": torch.tensor([a["category_id"] for a in anns], dtype=torch.int64),
            "image_id": image_id,
            "polygons": [list(a["segmentation"][0]) for a in anns],
        }
        return image, target


def collate_fn(batch):
    """torchvision references' collate, with the images stacked (all are 64x64)."""
    images, targets = zip(*batch)
    return torch.stack(images), list(targets)


def make_dataset(root: str | None = None) -> CocoLikeDetection:
    return CocoLikeDetection(root or fixture_dir("detection-v1", _build))


EXPECTED = {
    "samples_per_batch": 16,
    "diagnostics_present": [],
    "diagnostics_absent": ["skewed_labels", "worker_memory_growth"],
    "note": "labels are per box (a [k] tensor per image), not one class per sample",
}
