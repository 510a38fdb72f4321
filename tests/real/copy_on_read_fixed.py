"""The fix for ``copy_on_read_leak.py``: the same records serialized into one numpy buffer.

Why the shape matters: this is detectron2's ``DatasetFromList(serialize=True)``. Each record
is pickled, the bytes concatenated into one ``uint8`` array and located through an ``int64``
offsets array; ``__getitem__`` unpickles one record. The parent then holds two numpy arrays
(two Python objects) instead of 300k dicts, so workers read shared pages without writing
reference counts into them: no page is copied and worker memory stays flat. Same records,
same features, same pacing as the leaking version.

Measured like the leak (``python3 tests/real/measure_memory.py copy_on_read_fixed`` under
``capped 6``, 15 s, 2 workers): building took 0.4-0.6 s and left the parent at 277 MB RSS;
409 batches in 15 s. Per worker:

    USS 12 -> 12 MB and 11 -> 12 MB
    RSS 225 -> 225 MB in both
"""

from __future__ import annotations

import pickle
import time
from typing import Iterable

import numpy as np
from torch.utils.data import Dataset

try:
    from .copy_on_read_leak import NUM_RECORDS, features, iter_records
except ImportError:  # loaded by file path, as the tool loads a target
    from copy_on_read_leak import NUM_RECORDS, features, iter_records

batch_size = 64
dataloader_kwargs = {"num_workers": 2, "shuffle": True}


def serialize(records: Iterable[dict]) -> tuple[np.ndarray, np.ndarray]:
    """One uint8 buffer of pickled records and the end offset of each."""
    buffer, ends = bytearray(), []
    for record in records:
        buffer += pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        ends.append(len(buffer))
    return np.frombuffer(buffer, dtype=np.uint8), np.array(ends, dtype=np.int64)


class SerializedRecords(Dataset):
    def __init__(self, records: Iterable[dict], work_s: float = 0.001) -> None:
        self.buffer, self.ends = serialize(records)
        self.work_s = work_s

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, index: int):
        if self.work_s:
            time.sleep(self.work_s)
        start = int(self.ends[index - 1]) if index > 0 else 0
        record = pickle.loads(memoryview(self.buffer[start:int(self.ends[index])]))
        return features(record)


def make_dataset(num_records: int = NUM_RECORDS, work_s: float = 0.001) -> SerializedRecords:
    return SerializedRecords(iter_records(num_records), work_s=work_s)


EXPECTED = {
    "samples_per_batch": 64,
    "diagnostics_present": [],
    "diagnostics_absent": ["worker_memory_growth", "skewed_labels"],
    "note": "serialized records: worker USS and RSS stay flat",
}
