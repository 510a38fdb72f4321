"""The copy-on-read "leak" of pytorch/pytorch#13246: a big Python list of dicts in the dataset.

Why the shape matters: ``make_dataset()`` builds 300k small annotation dicts in the parent
(what ``json.load`` of a COCO-style annotation file gives; about 180 MB of Python objects).
Forked workers share those pages copy-on-write, but merely *reading* a record writes its
reference count (and those of its values), so every page a worker touches becomes a private
copy. Each worker's private memory (USS) therefore grows steadily as it reads random records,
while its RSS hardly moves (the shared pages were already counted in it). Nothing is wrong
with the code per se; the fix is to keep the records out of Python objects
(``copy_on_read_fixed.py``).

Per sample ``__getitem__`` waits ``work_s`` (default 1 ms, standing in for reading and
decoding the image the record points to), which paces the page copying over ~15 s instead
of finishing it in a second.

Measured with ``plain DataLoader(batch_size=64, shuffle=True, num_workers=2)`` for 15 s under
``capped 6`` (``python3 tests/real/measure_memory.py copy_on_read_leak``), psutil every
second, on a 2-core machine (Linux 6.18, Python 3.11, torch 2.13 CPU). Building took 0.8 s
and left the parent at 399 MB RSS. 399 batches in 15 s (about 1700 samples/s). Per worker:

    USS  23 -> 105 MB and 24 -> 106 MB (t=1 s: 23, 5 s: 62, 10 s: 91, 14 s: 106; still rising
         3-4 MB/s at the end, towards the ~180 MB of records)
    RSS 347 -> 347 MB in both (flat to 0.1 MB)
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

NUM_RECORDS = 300_000
NUM_CLASSES = 10

batch_size = 64
dataloader_kwargs = {"num_workers": 2, "shuffle": True}


def iter_records(n: int = NUM_RECORDS):
    """Deterministic COCO-like annotation records: str, int and float fields only."""
    return (
        {
            "file_name": f"train2017/{i:012d}.jpg",
            "image_id": 100_000 + i,
            "category": f"category_{i % 80}",
            "area": i * 0.37,
            "score": 1.0 / (i + 1),
            "caption": f"a photo of object {i} on a table",
        }
        for i in range(n)
    )


def make_records(n: int = NUM_RECORDS) -> list[dict]:
    return list(iter_records(n))


def features(record: dict) -> tuple[torch.Tensor, int]:
    """8 floats and a label out of one record (reading every field, as a mapper would)."""
    x = torch.tensor([
        record["area"], record["score"], float(record["image_id"]),
        float(len(record["file_name"])), float(len(record["category"])),
        float(len(record["caption"])), record["area"] * record["score"], 1.0,
    ])
    return x, record["image_id"] % NUM_CLASSES


class RecordList(Dataset):
    """Holds the records as a plain Python list of dicts: the pattern that leaks."""

    def __init__(self, records: list[dict], work_s: float = 0.001) -> None:
        self.records = records
        self.work_s = work_s

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        if self.work_s:
            time.sleep(self.work_s)
        return features(self.records[index])


def make_dataset(num_records: int = NUM_RECORDS, work_s: float = 0.001) -> RecordList:
    return RecordList(make_records(num_records), work_s=work_s)


EXPECTED = {
    "samples_per_batch": 64,
    "diagnostics_present": ["worker_memory_growth"],
    "diagnostics_absent": ["skewed_labels"],
    "note": "copy-on-read: each forked worker's USS grows as it reads records while its RSS "
            "stays flat; a rule watching RSS alone misses it",
}
