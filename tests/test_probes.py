"""The timing wrappers behave exactly like the wrapped dataset and tag each batch."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from engine.probes import (BatchMeta, TimedCollate, TimedIterableDataset, TimedMapDataset,
                           batch_size_of, nbytes_of, sizes_of, wrap_dataset)

from .datasets.small_map import SmallMap
from .datasets.stream import Stream


class WithGetitems(SmallMap):
    calls = 0

    def __getitems__(self, indices):
        WithGetitems.calls += 1
        return [self[i] for i in indices]


def _loader(dataset, **kwargs):
    auto = kwargs.get("batch_size", 1) is not None
    return DataLoader(wrap_dataset(dataset), collate_fn=TimedCollate(None, auto), **kwargs)


def test_map_wrapper_yields_the_same_batches_with_meta():
    plain = list(DataLoader(SmallMap(), batch_size=8))
    tagged = list(_loader(SmallMap(), batch_size=8))
    assert len(plain) == len(tagged)
    for (p_x, p_y), (batch, meta) in zip(plain, tagged):
        assert torch.equal(p_x, batch[0]) and torch.equal(p_y, batch[1])
        assert isinstance(meta, BatchMeta) and meta.worker_id == -1
        assert meta.fetch_s >= 0 and meta.collate_s >= 0


def test_inner_getitems_is_used_when_present():
    WithGetitems.calls = 0
    list(_loader(WithGetitems(), batch_size=16))
    assert WithGetitems.calls == 4


def test_workers_tag_their_batches():
    metas = [meta for _, meta in _loader(SmallMap(), batch_size=8, num_workers=2)]
    assert {m.worker_id for m in metas} == {0, 1}
    assert len({m.pid for m in metas}) == 2


def test_iterable_wrapper_and_no_auto_collation():
    batches = list(_loader(Stream(20), batch_size=5))
    assert [b[0].shape[0] for b in batches] == [5, 5, 5, 5]
    singles = list(_loader(SmallMap(4), batch_size=None))
    assert len(singles) == 4 and singles[0][1].worker_id == -1
    assert isinstance(TimedIterableDataset(Stream()), torch.utils.data.IterableDataset)


def test_attribute_access_passes_through():
    dataset = SmallMap(10)
    dataset.classes = ["a", "b"]
    assert TimedMapDataset(dataset).classes == ["a", "b"]


def test_batch_size_and_bytes():
    batch = (torch.zeros(4, 3, dtype=torch.float32), torch.zeros(4, dtype=torch.int64))
    assert batch_size_of(batch) == 4
    assert nbytes_of(batch) == 4 * 3 * 4 + 4 * 8
    assert nbytes_of({"x": np.zeros((2, 2), dtype=np.float64)}) == 32
    assert batch_size_of({"x": torch.zeros(7, 2)}) == 7


@pytest.mark.parametrize("batch", [
    (torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64)),  # the fast path
    [torch.zeros(5, 2), torch.zeros(5)],
    (torch.zeros(4, 3), ["a", "b", "c", "d"]),  # mixed: the general path
    {"x": torch.zeros(7, 2), "y": np.zeros(7)},
    (torch.tensor(1.0), torch.tensor(2.0)),  # 0-d tensors: one sample each, as before
    torch.zeros(6, 2),
])
def test_sizes_of_agrees_with_the_general_functions(batch):
    assert sizes_of(batch) == (batch_size_of(batch), nbytes_of(batch))
