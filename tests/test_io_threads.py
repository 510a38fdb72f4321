"""Threads for waiting I/O (child/io_threads.py, analyse/ceiling.py): the threaded fetch makes
the dataset's own batches, in order, in real workers; its pool ends with the trial; threads
are offered only where a batch's time is mostly waiting, and a measured row reaches the fix."""

import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from dataloader_tuner.analyse.ceiling import (BatchCost, threaded_prediction, threads_change,
                                              threads_for, measured_row, waiting_share)
from dataloader_tuner.analyse.fixes import named_fixes
from dataloader_tuner.analyse.text import ceiling_text
from dataloader_tuner.child.io_threads import ThreadedFetch, own_batched_fetch

from .test_ceiling import cost as cpu_bound_cost


class Squares(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.tensor([index * index]), index % 3


def batches(dataset, **kwargs):
    return [(x.tolist(), y.tolist()) for x, y in DataLoader(dataset, batch_size=8, **kwargs)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_threaded_fetch_makes_the_dataset_s_own_batches_in_order(num_workers):
    threaded = ThreadedFetch(Squares(), threads=4)
    before = {t.ident for t in threading.enumerate()}
    try:
        assert batches(threaded, num_workers=num_workers) == batches(Squares())
    finally:
        threaded.close()
    # its pool ended with the trial here (a worker's ends with the worker)
    assert not [t for t in threading.enumerate()
                if t.ident not in before and t.name.startswith("io-thread")]


def test_the_threaded_fetch_reads_and_writes_the_dataset_s_attributes():
    """A worker_init_fn on get_worker_info().dataset reaches the user's dataset both ways (an
    attribute written on the wrapper was lost: the dataset's __getitem__ failed, the trial with
    it); copy and pickle keep this object's own special methods."""
    import copy
    import pickle

    inner = Squares()
    threaded = ThreadedFetch(inner, threads=2)
    threaded.handle = "opened in the worker"
    assert inner.handle == "opened in the worker" and threaded.handle == inner.handle
    assert "handle" not in vars(threaded)
    for again in (copy.deepcopy(threaded), pickle.loads(pickle.dumps(threaded))):
        assert isinstance(again, ThreadedFetch) and again.threads == 2
        assert again.handle == "opened in the worker" and again[3][0].tolist() == [9]


def test_a_dataset_s_own_batched_fetch_is_left_alone():
    class Batched(Squares):
        def __getitems__(self, indices):
            return [self[i] for i in indices]

    assert own_batched_fetch(Batched())
    assert not own_batched_fetch(Squares())
    assert not own_batched_fetch(Subset(Squares(), range(10)))  # torch's: passes indices on


def cost(**changes) -> BatchCost:
    """2 workers, each batch of 8 waiting 40 ms for 1 ms of CPU (a remote store)."""
    return cpu_bound_cost(**{**dict(serial_ms=41.0, worker_ms=41.0, worker_cpu_ms=1.0,
                                    receive_ms=0.2, samples_per_batch=8.0, max_workers=2),
                             **changes})


def test_threads_are_offered_where_a_batch_mostly_waits_as_many_as_keep_it_busy():
    assert waiting_share(cost()) == pytest.approx(40 / 41)
    assert threads_for(cost(), batch_size=8) == 8  # 41 ms / 1 ms, at most a batch's samples
    assert threads_for(cost(), batch_size=64) == 16  # at most MAX_THREADS
    assert threads_for(cost(worker_ms=4.0), batch_size=64) == 4
    assert threads_for(cost(worker_cpu_ms=30.0), batch_size=8) is None  # it mostly works
    assert threads_for(cost(), batch_size=1) is None
    # 8 threads: 1 ms of CPU and 40/8 ms of waiting a batch, two workers
    assert threaded_prediction(cost(), 2, 8) == pytest.approx(2 * 8000 / (1 + 40 / 8), rel=1e-3)
    # without workers the main process makes them, its receiving left out
    assert threaded_prediction(cost(), 0, 8) == pytest.approx(8000 / 6.0, rel=1e-3)


def test_a_worker_waiting_on_its_hand_off_is_not_waiting_for_storage():
    """tests/real/detection.py as the tune learnt it: 1.5 ms of CPU making a batch in 1.5 ms,
    a cycle of 11.8 ms at 1 worker (the main process took 5 ms a batch receiving it). Read off
    the cycle, it waited 87% of its time: the tune measured 6 threads fetching (8 s) and named
    "overlap the waits for storage"; the pick made 10-16k samples/s, the threads 7-8k."""
    handed_off = cost(serial_ms=1.5, worker_ms=11.8, worker_cpu_ms=1.5, making_ms=1.5,
                      samples_per_batch=16.0)
    assert waiting_share(handed_off) == 0.0
    assert threads_for(handed_off, batch_size=16) is None
    remote = cost(making_ms=41.0)  # a remote store: its making is its cycle, and waits
    assert threads_for(remote, batch_size=8) == 8
    assert remote.cheaper(0.5, 0.0, 1.0).making_ms == pytest.approx(20.5)


def test_a_measured_threads_row_reaches_the_overlap_fix_and_the_text():
    now = 2 * 8000 / 41
    row = measured_row(threads_change(8, 2), threaded_prediction(cost(), 2, 8), 2500.0, 3.0,
                       now, "where your dataset can be read from several threads")
    fixes = named_fixes(None, [row], waits=True)  # too few looks to profile a waiting loader
    assert [f["fix"] for f in fixes] == ["overlap the waits for storage"]
    assert fixes[0]["measured_samples_per_s"] == 2500.0
    ceiling = {"sentence": "At its ceiling.", "measured_samples_per_s": now}
    lines = ceiling_text(ceiling, [row], fixes)
    assert any(line.startswith("measured: 8 threads fetching each batch in each worker")
               and "read from several threads" in line for line in lines)
    assert any("6.41x measured  overlap the waits" in line for line in lines)
    assert named_fixes(None, [], waits=False) == []
