"""The timing wrappers behave exactly like the wrapped dataset and tag each batch."""

import collections
import dataclasses
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dataloader_tuner.instrument.probes import (BatchMeta, TimedCollate, TimedIterableDataset,
                                               TimedMapDataset, wrap_dataset)
from dataloader_tuner.instrument.tensors import payload_bytes, samples_in, sizes_of

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
    assert samples_in(batch) == 4
    assert payload_bytes(batch) == 4 * 3 * 4 + 4 * 8
    assert payload_bytes({"x": np.zeros((2, 2), dtype=np.float64)}) == 32
    assert samples_in({"x": torch.zeros(7, 2)}) == 7
    assert payload_bytes(["ab", b"cde", 1, 2.0]) == 2 + 3 + 8 + 8


@pytest.mark.parametrize("batch", [
    (torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64)),  # the fast path
    [torch.zeros(5, 2), torch.zeros(5)],
    (torch.zeros(4, 3), ["a", "b", "c", "d"]),  # mixed: the general path
    {"x": torch.zeros(7, 2), "y": np.zeros(7)},
    (torch.tensor(1.0), torch.tensor(2.0)),  # 0-d tensors: one sample each, as before
    torch.zeros(6, 2),
])
def test_sizes_of_agrees_with_the_general_functions(batch):
    assert sizes_of(batch) == (samples_in(batch), payload_bytes(batch))


class Encoding(collections.UserDict):
    pass


@dataclasses.dataclass
class Batch:
    images: torch.Tensor
    meta: list


def test_any_mapping_or_dataclass_batch_is_read():
    encoding = Encoding(input_ids=torch.zeros(32, 9, dtype=torch.int64), labels=torch.zeros(32))
    assert samples_in(encoding) == 32 and payload_bytes(encoding) == 32 * 9 * 8 + 32 * 4
    batch = Batch(torch.zeros(5, 2), [{"id": 1}] * 5)
    assert samples_in(batch) == 5 and payload_bytes(batch) == 5 * 2 * 4 + 5 * 8


def test_samples_are_the_items_collated_not_a_guess():
    """A detection-style collate returns a list of per-image dicts with a varying number of boxes:
    with auto-batching, samples are the items the batch was made of."""
    items = [{"boxes": torch.zeros(i % 3, 4), "image": torch.zeros(3, 8, 8)} for i in range(16)]
    collate = TimedCollate(lambda samples: samples, auto_collation=True)
    _, meta = collate(items)
    assert meta.samples == 16


def test_the_byte_walk_is_bounded_and_estimates_long_lists():
    polygons = [[float(i)] * 1000 for i in range(200)]  # 200k Python floats
    started = time.thread_time()  # (a time slice lost to another process is not the walk's)
    estimate = payload_bytes({"polygons": polygons, "image": torch.zeros(10)})
    assert time.thread_time() - started < 0.01  # visits <= WALK_BUDGET objects, not 200k
    assert 0.5 * 200_000 * 8 < estimate - 40 < 2 * 200_000 * 8


def test_a_self_made_batch_is_counted_by_its_tensors_not_its_key_strings():
    keys = [f"sample-{i:06d}" for i in range(256)]
    batch = (keys, torch.zeros(256, 3, 8, 8), torch.zeros(256, dtype=torch.int64))
    assert samples_in(batch) == 256
    assert samples_in([{"a": 1}, {"a": 2}]) == 2  # a list of per-sample dicts


def test_fast_batches_have_their_making_timed_on_a_sample_and_still_say_who_made_them():
    from dataloader_tuner.instrument import probes

    collate = TimedCollate(None, auto_collation=True)
    dataset = TimedMapDataset(SmallMap(64))
    metas = [collate(dataset.__getitems__([0, 1, 2, 3]))[1] for _ in range(200)]
    timed = [i for i, m in enumerate(metas) if isinstance(m, BatchMeta)]
    # The first TIME_ALL_FIRST all timed, then (these take microseconds) every TIME_EVERY-th.
    assert timed[:probes.TIME_ALL_FIRST] == list(range(probes.TIME_ALL_FIRST))
    later = [i for i in timed if i >= probes.TIME_ALL_FIRST]
    assert later and all(i % probes.TIME_EVERY == 0 for i in later)
    assert len(later) == len(range(probes.TIME_ALL_FIRST, 200, probes.TIME_EVERY))
    untimed = [m for m in metas if not isinstance(m, BatchMeta)]
    assert untimed and all(m == (-1, metas[0].pid, 4) for m in untimed)


def test_slow_batches_have_their_making_timed_on_every_batch():
    class Slow(SmallMap):
        def __getitem__(self, index):
            time.sleep(0.0012)  # past FAST_BATCH_S for a 1-sample batch
            return super().__getitem__(index)

    collate = TimedCollate(None, auto_collation=True)
    dataset = TimedMapDataset(Slow(8))
    from dataloader_tuner.instrument import probes
    probes._timer.made = probes.TIME_ALL_FIRST  # as if past the first batches already
    metas = [collate(dataset.__getitems__([1]))[1] for _ in range(20)]
    assert all(isinstance(m, BatchMeta) for m in metas)


def test_costly_reads_are_sampled_when_they_would_cost_over_half_a_percent():
    from dataloader_tuner.instrument.probes import MAX_EVERY, SAMPLE_EVERY, _FetchTimer

    timer = _FetchTimer()
    assert timer.read_every(batch_s=0.010, reads_s=0.000002) == 1  # 0.02%: every batch
    assert timer.read_every(batch_s=0.0005, reads_s=0.000002) == SAMPLE_EVERY  # a fast batch
    assert timer.read_every(batch_s=0.0016, reads_s=0.00021) == 27  # a 210 us walk of 1.6 ms
    assert timer.read_every(batch_s=0.001, reads_s=0.01) == MAX_EVERY


class _Holds:
    def __init__(self, rng=None) -> None:
        self.features, self.targets = [1.0, 2.0], [0, 1]
        if rng is not None:
            self.rng = rng


@pytest.mark.skipif(sys.version_info < (3, 11), reason="an instance's dict always exists before")
def test_probing_the_first_fetch_leaves_the_datasets_attributes_where_python_keeps_them():
    """Reading vars() moves an instance's attributes into a dict for good, and each of its
    ``self.x`` loads ran slower after (first_fetch.rng_attributes): a dataset holding no generator
    is searched without it."""
    import gc

    from dataloader_tuner.instrument.first_fetch import rng_state

    plain = _Holds()
    assert not [name for name in rng_state(plain) if name.startswith("self.")]
    assert not any(type(r) is dict for r in gc.get_referents(plain))  # never materialized
    import random
    holder = _Holds(random.Random(3))
    assert "self.rng" in rng_state(holder)  # a generator is still found, and named
