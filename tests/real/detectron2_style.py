"""detectron2-style data: a list of "dataset dicts" and a mapper, batched by
``trivial_batch_collator``.

Why the shape matters: detectron2 registers a dataset as a list of plain Python dicts
(``file_name``, ``height``, ``width``, ``image_id``, ``annotations`` = list of dicts with
``bbox``, ``bbox_mode``, ``category_id`` and ``segmentation`` polygons of ~60 floats).
``DatasetFromList`` + ``MapDataset`` read one dict, load the image from ``file_name`` and
return a dict; ``trivial_batch_collator`` returns the *list* of those dicts unchanged. So a
batch is a list of dicts with no tensor on top: its sample count is ``len(batch)``, and
``category_id`` values are per instance, not per image.

Data: 96 small JPEG files (64x80, Pillow) under a fixture folder, plus the dicts in
``dataset_dicts.json`` (what a registered dataset function returns).
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

try:
    from ._data import fixture_dir
except ImportError:  # loaded by file path, as the tool loads a target
    from _data import fixture_dir

NUM_IMAGES = 96
HEIGHT, WIDTH = 64, 80
POLYGON_FLOATS = 60

batch_size = 8


def trivial_batch_collator(batch):
    """detectron2.data.build.trivial_batch_collator: a batch is the list itself."""
    return batch


collate_fn = trivial_batch_collator


def _build(folder: str) -> None:
    rng = np.random.default_rng(2)
    os.makedirs(os.path.join(folder, "images"))
    dicts = []
    for image_id in range(NUM_IMAGES):
        file_name = os.path.join("images", f"{image_id:06d}.jpg")
        pixels = rng.integers(0, 256, size=(HEIGHT, WIDTH, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, file_name), quality=85)
        annotations = []
        for _ in range(1 + image_id % 7):
            x0, y0 = float(rng.uniform(0, WIDTH - 8)), float(rng.uniform(0, HEIGHT - 8))
            x1, y1 = float(rng.uniform(x0 + 4, WIDTH)), float(rng.uniform(y0 + 4, HEIGHT))
            xs = rng.uniform(x0, x1, POLYGON_FLOATS // 2)
            ys = rng.uniform(y0, y1, POLYGON_FLOATS // 2)
            polygon = [round(float(v), 2) for pair in zip(xs, ys) for v in pair]
            annotations.append({"bbox": [round(x0, 2), round(y0, 2), round(x1, 2), round(y1, 2)],
                                "bbox_mode": 0,  # BoxMode.XYXY_ABS
                                "category_id": int(rng.integers(0, 20)),
                                "segmentation": [polygon]})
        dicts.append({"file_name": file_name, "height": HEIGHT, "width": WIDTH,
                      "image_id": image_id, "annotations": annotations})
    with open(os.path.join(folder, "dataset_dicts.json"), "w") as f:
        json.dump(dicts, f)


class MappedDatasetDicts(Dataset):
    """``DatasetFromList(dicts, copy=True)`` followed by a minimal ``DatasetMapper``."""

    def __init__(self, root: str, dicts: list[dict]) -> None:
        self.root = root
        self.dicts = dicts

    def __len__(self) -> int:
        return len(self.dicts)

    def __getitem__(self, index: int) -> dict:
        record = copy.deepcopy(self.dicts[index])  # the mapper modifies its copy in place
        with Image.open(os.path.join(self.root, record["file_name"])) as im:
            pixels = np.asarray(im.convert("RGB"))
        record["image"] = torch.from_numpy(pixels.transpose(2, 0, 1).copy())  # uint8 CHW
        annos = record.pop("annotations")
        record["instances"] = {
            "gt_boxes": torch.tensor([a["bbox"] for a in annos], dtype=torch.float32),
            "gt_classes": torch.tensor([a["category_id"] for a in annos], dtype=torch.int64),
            "gt_masks": [a["segmentation"] for a in annos],  # polygons stay Python lists
        }
        return record


def make_dataset(root: str | None = None) -> MappedDatasetDicts:
    root = root or fixture_dir("detectron2_style-v1", _build)
    with open(os.path.join(root, "dataset_dicts.json")) as f:
        dicts = json.load(f)
    return MappedDatasetDicts(root, dicts)


EXPECTED = {
    "samples_per_batch": 8,
    "diagnostics_present": [],
    "diagnostics_absent": ["skewed_labels", "worker_memory_growth"],
    "note": "a batch is a plain list of per-image dicts; category ids are per instance",
}
