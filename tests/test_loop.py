"""The one per-batch loop (record/loop.py), on hand-made batch sources."""

import gc
import time
import weakref

import torch
from torch.utils.data import DataLoader

from dataloader_tuner import watch
from dataloader_tuner.record.ledger import BatchLedger
from dataloader_tuner.record.loop import BatchSource, TimedLoop


class Batch:
    """A batch a weak reference can follow."""


def test_the_loop_holds_no_batch_while_the_job_has_it():
    """Freeing a batch is the job's, when it lets go, as unwatched (NOTE [ One batch, in
    order ]): nothing in the loop keeps it alive."""
    made = [Batch() for _ in range(3)]
    refs = [weakref.ref(b) for b in made]

    def produce():  # hands each batch over and keeps none
        while made:
            yield made.pop(0), (0, 0, 1)  # (an untimed batch's meta: worker, pid, samples)

    rows: list = []
    loop = TimedLoop(BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None), rows.append)
    batches = loop.epoch(loop.ledger.new_epoch(), BatchSource(produce()))
    batch = next(batches)
    assert refs[0]() is batch
    del batch
    gc.collect()
    assert refs[0]() is None  # freed with the job's reference, not at the next batch
    assert next(batches) is refs[1]()
    assert len(rows) == 1


def test_a_watched_loop_frees_each_batch_when_it_lets_go(db_path):
    watched = watch(DataLoader(torch.arange(32.0), batch_size=8, num_workers=2), name="free",
                    db=db_path)
    try:
        freed = []
        for batch in watched:
            ref = weakref.ref(batch)
            del batch
            freed.append(ref() is None)
        assert freed == [True] * 4
    finally:
        watched.close()
